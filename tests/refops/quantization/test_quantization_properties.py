"""Hypothesis properties of every FP8 scheme: error bound, idempotence, row/column-wise consistency.

Inputs are drawn as (seed, shape, magnitude) and built with a torch generator, which
keeps each example cheap while still covering wide ranges of scales.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from refops.quantization import (
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
    QuantizedTensor,
)

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
FP8_DTYPES = st.sampled_from([DType.kFloat8E4M3, DType.kFloat8E5M2])
# (mantissa bits, min normal exponent, max) of each format
_FORMAT = {DType.kFloat8E4M3: (3, -6, 448.0), DType.kFloat8E5M2: (2, -14, 57344.0)}
_TORCH_FP8 = {DType.kFloat8E4M3: torch.float8_e4m3fn, DType.kFloat8E5M2: torch.float8_e5m2}


def _input(seed: int, rows: int, cols: int, log2_mag: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen) * 2.0**log2_mag
    # some exact zeros and a few outliers per tensor
    x[torch.rand(rows, cols, generator=gen) < 0.05] = 0.0
    x[torch.rand(rows, cols, generator=gen) < 0.01] *= 64
    return x.to(dtype)


def _half_quantum(v: torch.Tensor, fp8_dtype: DType) -> torch.Tensor:
    """Half the spacing of the FP8 grid around |v| (the RNE error bound)."""
    mantissa_bits, min_exp, _ = _FORMAT[fp8_dtype]
    exp = torch.floor(torch.log2(v.abs().double().clamp_min(2.0**min_exp))).clamp_min(min_exp)
    return 0.5 * torch.pow(2.0, exp - mantissa_bits)


def _check_error_bound(x: torch.Tensor, xhat: torch.Tensor, scale: torch.Tensor, fp8_dtype: DType,
                       scale_rounding: bool = False) -> None:
    """|xhat - x| <= half a quantum of the block's scaled grid (plus scale_inv rounding if not pow2)."""
    x64, xhat64, s64 = x.double(), xhat.double(), scale.double()
    bound = _half_quantum(x64 * s64, fp8_dtype) / s64
    if scale_rounding:  # scale_inv = RN(1/s) and x*s rounded to fp32: relative 2^-23 each
        bound = bound + x64.abs() * 2.0**-21
    assert bool(((xhat64 - x64).abs() <= bound).all())


def _pow2_scale(scale_inv_per_element: torch.Tensor) -> torch.Tensor:
    return 1.0 / scale_inv_per_element.double()


# --------------------------------------------------------------- error bound
@SETTINGS
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 40), cols=st.integers(1, 40),
       log2_mag=st.integers(-20, 20), fp8_dtype=FP8_DTYPES, pow2=st.booleans())
def test_current_scaling_error_bound(seed, rows, cols, log2_mag, fp8_dtype, pow2) -> None:
    x = _input(seed, rows, cols, log2_mag)
    quantizer = Float8CurrentScalingQuantizer(fp8_dtype, "cpu", force_pow_2_scales=pow2)
    q = quantizer(x)
    scale = quantizer.scale.expand_as(x)
    for usage in ("rowwise", "columnwise"):
        _check_error_bound(x, q.dequantize(usage=usage), scale, fp8_dtype, scale_rounding=not pow2)


@SETTINGS
@given(seed=st.integers(0, 2**31), mb=st.integers(1, 3), kb=st.integers(1, 3), log2_mag=st.integers(-20, 20),
       fp8_dtype=FP8_DTYPES, two_d=st.booleans(), dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_mxfp8_error_bound(seed, mb, kb, log2_mag, fp8_dtype, two_d, dtype) -> None:
    x = _input(seed, 32 * mb, 32 * kb, log2_mag, dtype)
    q = MXFP8Quantizer(fp8_dtype, with_2d_quantization=two_d)(x)
    e_row = q._rowwise_scale_inv[: x.shape[0], :kb].double().repeat_interleave(32, dim=1)
    e_col = q._columnwise_scale_inv[:mb, : x.shape[1]].double().repeat_interleave(32, dim=0)
    _check_error_bound(x, q.dequantize(dtype=torch.float32, usage="rowwise"), torch.pow(2.0, 127 - e_row), fp8_dtype)
    _check_error_bound(x, q.dequantize(dtype=torch.float32, usage="columnwise"), torch.pow(2.0, 127 - e_col),
                       fp8_dtype)


@SETTINGS
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 140), cols=st.integers(1, 140),
       log2_mag=st.integers(-20, 20), fp8_dtype=FP8_DTYPES, dim=st.sampled_from([1, 2]), pow2=st.booleans())
def test_float8_block_error_bound(seed, rows, cols, log2_mag, fp8_dtype, dim, pow2) -> None:
    x = _input(seed, rows, cols, log2_mag)
    q = Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=True, block_scaling_dim=dim,
                             force_pow_2_scales=pow2)(x)
    b = 128
    if dim == 2:
        s = q._rowwise_scale_inv[: -(-rows // b), : -(-cols // b)]
        row_s = col_s = s.repeat_interleave(b, 0)[:rows].repeat_interleave(b, 1)[:, :cols]
    else:
        row_s = q._rowwise_scale_inv[: -(-cols // b), :rows].t().repeat_interleave(b, 1)[:, :cols]
        col_s = q._columnwise_scale_inv[: -(-rows // b), :cols].repeat_interleave(b, 0)[:rows]
    _check_error_bound(x, q.dequantize(usage="rowwise"), _pow2_scale(row_s), fp8_dtype, scale_rounding=not pow2)
    _check_error_bound(x, q.dequantize(usage="columnwise"), _pow2_scale(col_s), fp8_dtype, scale_rounding=not pow2)


# --------------------------------------------------------------- idempotence
def _representable(seed: int, rows: int, cols: int, fp8_dtype: DType, log2_scale: int, block_rows: int,
                   block_cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random FP8 codes (no NaN/inf) times 2^log2_scale; every block holds +-max, so its scale is exact."""
    gen = torch.Generator().manual_seed(seed)
    fp8 = _TORCH_FP8[fp8_dtype]
    codes = torch.randint(0, 256, (rows, cols), generator=gen, dtype=torch.int32).to(torch.uint8)
    values = codes.view(fp8).float()
    fmax = _FORMAT[fp8_dtype][2]
    values = torch.where(values.isfinite(), values, torch.zeros_like(values)).clamp(-fmax, fmax)
    values[::block_rows, ::block_cols] = fmax  # one max per block
    codes = values.to(fp8).view(torch.uint8)
    return values * 2.0**log2_scale, codes


@SETTINGS
@given(seed=st.integers(0, 2**31), fp8_dtype=FP8_DTYPES, log2_scale=st.integers(-30, 30))
def test_representable_values_quantize_to_themselves(seed, fp8_dtype, log2_scale) -> None:
    x, codes = _representable(seed, 64, 256, fp8_dtype, log2_scale, 1, 32)
    # per-tensor: amax = max * 2^k -> s = 2^-k exactly
    q = Float8CurrentScalingQuantizer(fp8_dtype, "cpu")(x)
    assert torch.equal(q._data, codes) and torch.equal(q.dequantize(), x)
    # MXFP8: each 1x32 block's amax is max * 2^k -> e = 127 + k exactly (also every 32x1 block holds one)
    x_mx, codes_mx = _representable(seed, 64, 256, fp8_dtype, log2_scale, 32, 1)
    x_mx[::1, ::32] = _FORMAT[fp8_dtype][2] * 2.0**log2_scale
    codes_mx[::1, ::32] = codes_mx[0, 0]
    q = MXFP8Quantizer(fp8_dtype)(x_mx)
    assert torch.equal(q._rowwise_data, codes_mx) and torch.equal(q._columnwise_data, codes_mx)
    # FP8 block 1x128 / 128x128 with pow2 scales
    for dim in (1, 2):
        q = Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=False, block_scaling_dim=dim)(x)
        assert torch.equal(q._rowwise_data, codes) and torch.equal(q.dequantize(), x)


@SETTINGS
@given(seed=st.integers(0, 2**31), log2_mag=st.integers(-10, 10), fp8_dtype=FP8_DTYPES)
def test_requantizing_dequantized_values_is_a_fixed_point(seed, log2_mag, fp8_dtype) -> None:
    x = _input(seed, 64, 160, log2_mag)
    quantizers = [
        MXFP8Quantizer(fp8_dtype, columnwise=False),
        Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=False, block_scaling_dim=1),
        Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=False, block_scaling_dim=2),
        Float8CurrentScalingQuantizer(fp8_dtype, "cpu", force_pow_2_scales=True),
    ]
    for quantizer in quantizers:
        if isinstance(quantizer, MXFP8Quantizer):
            x_in = x[:, :128]
        else:
            x_in = x
        once = quantizer(x_in).dequantize()
        assert torch.equal(quantizer(once).dequantize(), once), type(quantizer).__name__


# ------------------------------------------------------- row/column-wise views
def _transposed_views_agree(q: QuantizedTensor) -> None:
    assert torch.equal(q.dequantize(usage="rowwise"), q.dequantize(usage="columnwise"))


@SETTINGS
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 140), cols=st.integers(1, 140), fp8_dtype=FP8_DTYPES)
def test_views_agree_where_they_must(seed, rows, cols, fp8_dtype) -> None:
    x = _input(seed, rows, cols, 0)
    per_tensor = Float8CurrentScalingQuantizer(fp8_dtype, "cpu")(x)
    assert torch.equal(per_tensor._transpose, per_tensor._data.t())
    _transposed_views_agree(per_tensor)
    block2d = Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=True, block_scaling_dim=2)(x)
    assert torch.equal(block2d._columnwise_data, block2d._rowwise_data.t())
    _transposed_views_agree(block2d)
    x32 = _input(seed, 32 * (1 + rows % 3), 32 * (1 + cols % 3), 0)
    mx2d = MXFP8Quantizer(fp8_dtype, with_2d_quantization=True)(x32)
    assert torch.equal(mx2d._rowwise_data, mx2d._columnwise_data)
    _transposed_views_agree(mx2d)
    x16 = _input(seed, 16 * (1 + rows % 4), 16 * (1 + cols % 4), 0)
    nv2d = NVFP4Quantizer(with_2d_quantization=True)(x16)
    _transposed_views_agree(nv2d)


@SETTINGS
@given(seed=st.integers(0, 2**31), rows=st.integers(1, 140), cols=st.integers(1, 140), fp8_dtype=FP8_DTYPES,
       log2_mag=st.integers(-10, 10))
def test_1d_columnwise_is_the_rowwise_quantization_of_the_transpose(seed, rows, cols, fp8_dtype, log2_mag) -> None:
    x = _input(seed, rows, cols, log2_mag)
    both = Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=True, block_scaling_dim=1)(x)
    of_t = Float8BlockQuantizer(fp8_dtype, rowwise=True, columnwise=False, block_scaling_dim=1)(x.t().contiguous())
    assert torch.equal(both._columnwise_data, of_t._rowwise_data)
    assert torch.equal(both._columnwise_scale_inv, of_t._rowwise_scale_inv)
    x32 = _input(seed, 32 * (1 + rows % 3), 32 * (1 + cols % 3), log2_mag)
    mx = MXFP8Quantizer(fp8_dtype)(x32)
    mx_t = MXFP8Quantizer(fp8_dtype, columnwise=False)(x32.t().contiguous())
    m, k = x32.shape
    assert torch.equal(mx._columnwise_data, mx_t._rowwise_data.t())
    assert torch.equal(mx._columnwise_scale_inv[: m // 32, :k], mx_t._rowwise_scale_inv[:k, : m // 32].t())
