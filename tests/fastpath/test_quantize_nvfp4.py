"""Fast-path NVFP4 kernels against the reference, bit for bit, on the GPU.

Every option combination the reference accepts (row-wise / column-wise, 1x16 or
16x16 tiles, RHT with and without the sign mask, stochastic rounding from given
random bytes, 4over6 with MAE/MSE and E = 256/448, row-scaled) on fp32/fp16/bf16,
aligned and odd shapes, special values and non-contiguous inputs; the same error
type where the reference rejects the call; dequantization of both usages.
"""

from __future__ import annotations

import pytest
import torch
from test_quantize_differential import (
    DTYPES,
    assert_identical,
    assert_same_error,
    make_input,
    random_bytes,
    run_both,
)

#: (shape, input mode): aligned and odd tile counts, each input mode more than once.
SHAPES = [((16, 16), "edge"), ((64, 288), "inf"), ((64, 288), "edge"), ((48, 512), "plain"), ((80, 32), "edge"),
          ((512, 1024), "plain")]


def _options() -> list[dict]:
    """Every combination the reference accepts (RHT needs bf16 when column-wise; checked per case)."""
    combos = []
    for two_d in (False, True):
        for rht in (False, True):
            for sr in (False, True):
                for four_over_six in (False, True):
                    if (two_d and rht) or (four_over_six and (sr or rht)):
                        continue
                    variants = [("MAE", 256.0), ("MSE", 448.0), ("MAE", 448.0)] if four_over_six else [("MAE", 256.0)]
                    for err_mode, e4m3_max in variants:
                        combos.append(dict(with_2d_quantization=two_d, with_rht=rht, stochastic_rounding=sr,
                                           use_4over6=four_over_six, err_mode=err_mode, e4m3_max_4over6=e4m3_max))
    return combos


OPTIONS = _options()


def _name(o: dict) -> str:
    flags = [k for k in ("with_2d_quantization", "with_rht", "stochastic_rounding", "use_4over6") if o[k]]
    extra = f"-{o['err_mode']}-{int(o['e4m3_max_4over6'])}" if o["use_4over6"] else ""
    return "+".join(flags or ["plain"]) + extra


def _quantize_kwargs(x: torch.Tensor, options: dict, rowwise: bool, columnwise: bool, seed: int = 0) -> dict:
    m, k = x.shape
    sr = options["stochastic_rounding"]
    return dict(options, rowwise=rowwise, columnwise=columnwise,
                random_bytes_rowwise=random_bytes((m, k), x.device, seed) if sr and rowwise else None,
                random_bytes_columnwise=random_bytes((k, m), x.device, seed + 1) if sr and columnwise else None)


@pytest.mark.parametrize("options", OPTIONS, ids=_name)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("usage", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("shape,mode", SHAPES)
def test_quantize_nvfp4(fastpath_backend, reference_backend, cuda, options, dtype, usage, shape, mode):
    if options["with_rht"] and usage[1] and dtype != torch.bfloat16:
        pytest.skip("the RHT needs bf16 input (rejection tested separately)")
    x = make_input(shape, dtype, cuda, mode, seed=7, transposed=shape == (48, 512))
    kwargs = _quantize_kwargs(x, options, *usage)
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x, **kwargs)
    assert_identical(ref, fast, f"quantize_nvfp4 {_name(options)} {dtype} {usage} {shape} {mode}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 16), (17, 48), (3, 1024)])
@pytest.mark.parametrize("sr", [False, True])
def test_quantize_nvfp4_rowwise_odd_rows(fastpath_backend, reference_backend, cuda, dtype, shape, sr):
    """Row-wise 1x16 allows any M."""
    x = make_input(shape, dtype, cuda, "edge", seed=8)
    options = dict(OPTIONS[0], stochastic_rounding=sr)
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x,
                                     **_quantize_kwargs(x, options, True, False))
    assert_identical(ref, fast, f"quantize_nvfp4 rowwise {dtype} {shape} sr={sr}")


@pytest.mark.parametrize("with_random_sign_mask", [False, True])
def test_quantize_nvfp4_rht_sign_mask(fastpath_backend, reference_backend, cuda, with_random_sign_mask):
    x = make_input((64, 256), torch.bfloat16, cuda, "edge", seed=9)
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x, rowwise=True,
                                     columnwise=True, with_rht=True, with_random_sign_mask=with_random_sign_mask)
    assert_identical(ref, fast, f"quantize_nvfp4 rht sign_mask={with_random_sign_mask}")


def _mixed_block_ranges(dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Rows in groups of 16: randn (every block's scaled values near 6, below 7: the kernels' e2m1_rne_min3 path);
    randn * 2^-30 (block scales round to 0, the encode multiplier is FLT_MAX: the generic path); randn * 2^-16
    (block scales in E4M3's subnormal range, rounded coarsely: either path, block by block); a mix within rows."""
    g = torch.Generator().manual_seed(11)
    x = torch.randn(64, 256, generator=g)
    x[16:32] *= 2.0**-30
    x[32:48] *= 2.0**-16
    x[48:, ::3] *= 2.0**-12
    return x.to(dtype).to(device)


@pytest.mark.parametrize("options", [o for o in OPTIONS if not o["stochastic_rounding"]], ids=_name)
@pytest.mark.parametrize("dtype", DTYPES)
def test_quantize_nvfp4_both_encodings(fastpath_backend, reference_backend, cuda, options, dtype):
    """Blocks whose scaled values stay below 7 and blocks whose do not (see _mixed_block_ranges), in one tensor."""
    if options["with_rht"] and dtype != torch.bfloat16:
        pytest.skip("the RHT needs bf16 input (rejection tested separately)")
    x = _mixed_block_ranges(dtype, cuda)
    kwargs = _quantize_kwargs(x, options, True, True)
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x, **kwargs)
    assert_identical(ref, fast, f"quantize_nvfp4 mixed block ranges {_name(options)} {dtype}")


def test_quantize_nvfp4_row_scaled(fastpath_backend, reference_backend, cuda):
    for use_4over6 in (False, True):
        x = make_input((64, 128), torch.bfloat16, cuda, "edge", seed=10)
        (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x, rowwise=True,
                                         columnwise=True, row_scaled=True, use_4over6=use_4over6)
        assert_identical(ref, fast, f"quantize_nvfp4 row_scaled 4over6={use_4over6}")


def test_stochastic_rounding_consumes_the_given_bytes(fastpath_backend, reference_backend, cuda):
    x = make_input((64, 256), torch.bfloat16, cuda, seed=11)
    options = dict(rowwise=True, columnwise=True, with_rht=True, stochastic_rounding=True)
    first = dict(random_bytes_rowwise=random_bytes((64, 256), cuda, 1),
                 random_bytes_columnwise=random_bytes((256, 64), cuda, 2))
    second = dict(random_bytes_rowwise=random_bytes((64, 256), cuda, 3),
                  random_bytes_columnwise=random_bytes((256, 64), cuda, 4))
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "quantize_nvfp4", x, **options, **first)
    assert_identical(ref, fast, "SR with the same bytes")
    other = fastpath_backend.quantize_nvfp4(x, **options, **second)
    for index, what in ((0, "row-wise"), (3, "column-wise")):
        assert not torch.equal(fast[index], other[index]), f"{what} SR data ignores the random bytes"


REJECTED = [
    ((16, 24), dict(rowwise=True, columnwise=False), torch.bfloat16),  # K % 16
    ((24, 32), dict(rowwise=True, columnwise=True), torch.bfloat16),  # column-wise needs M % 16
    ((24, 32), dict(rowwise=True, columnwise=False, with_2d_quantization=True), torch.bfloat16),
    ((32, 32), dict(rowwise=True, columnwise=True, with_rht=True), torch.float32),  # RHT needs bf16
    ((32, 32), dict(rowwise=True, columnwise=True, with_rht=True, with_2d_quantization=True), torch.bfloat16),
    ((32, 32), dict(rowwise=True, columnwise=False, use_4over6=True, stochastic_rounding=True), torch.bfloat16),
    ((32, 32), dict(rowwise=True, columnwise=False, use_4over6=True, e4m3_max_4over6=300.0), torch.bfloat16),
    ((32, 32), dict(rowwise=True, columnwise=False, use_4over6=True, err_mode="max"), torch.bfloat16),
    ((32, 32), dict(rowwise=True, columnwise=False, stochastic_rounding=True), torch.bfloat16),  # no bytes
    ((32, 32), dict(rowwise=False, columnwise=False), torch.bfloat16),
    ((2, 16, 32), dict(rowwise=True, columnwise=False), torch.bfloat16),  # not 2-D
]


@pytest.mark.parametrize("shape,kwargs,dtype", REJECTED)
def test_quantize_nvfp4_rejects_the_same_calls(fastpath_backend, reference_backend, cuda, shape, kwargs, dtype):
    assert_same_error(reference_backend, fastpath_backend, "quantize_nvfp4", make_input(shape, dtype, cuda), **kwargs)


def test_quantize_nvfp4_rejects_wrong_random_bytes(fastpath_backend, reference_backend, cuda):
    x = make_input((32, 64), torch.bfloat16, cuda)
    for wrong in (random_bytes((64, 32), cuda), random_bytes((32, 64), cuda).float()):
        assert_same_error(reference_backend, fastpath_backend, "quantize_nvfp4", x, rowwise=True, columnwise=False,
                          stochastic_rounding=True, random_bytes_rowwise=wrong)


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("columnwise", [False, True])
@pytest.mark.parametrize("shape", [(16, 16), (48, 96), (2, 64, 160), (256, 1024)])
@pytest.mark.parametrize("e4m3_max,per_row", [(448.0, False), (256.0, False), (448.0, True)])
def test_dequantize_nvfp4(fastpath_backend, reference_backend, cuda, out_dtype, columnwise, shape, e4m3_max, per_row):
    m, k = shape[0] * (shape[1] if len(shape) == 3 else 1), shape[-1]
    rows, cols = (k, m) if columnwise else (m, k)
    data = random_bytes((rows, cols // 2), cuda, seed=12)  # every code, -0 included
    scale = random_bytes(((rows + 127) // 128 * 128, (cols // 16 + 3) // 4 * 4), cuda, seed=13)  # NaN bytes too
    amax = make_input((rows if per_row else 1,), torch.float32, cuda, seed=14).abs()
    (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "dequantize_nvfp4", data, scale, amax,
                                     shape=shape, columnwise=columnwise, e4m3_max=e4m3_max, out_dtype=out_dtype)
    assert_identical(ref, fast, f"dequantize_nvfp4 {out_dtype} col={columnwise} {shape} E={e4m3_max} per_row={per_row}")


def test_dequantize_nvfp4_of_quantized_data(fastpath_backend, reference_backend, cuda):
    x = make_input((128, 256), torch.bfloat16, cuda, "edge", seed=15)
    q = reference_backend.quantize_nvfp4(x, rowwise=True, columnwise=True, with_2d_quantization=True)
    for columnwise, (data, scale, amax) in ((False, q[:3]), (True, q[3:])):
        (ref, *_), (fast, *_) = run_both(reference_backend, fastpath_backend, "dequantize_nvfp4", data, scale, amax,
                                         shape=(128, 256), columnwise=columnwise, e4m3_max=448.0,
                                         out_dtype=torch.bfloat16)
        assert_identical(ref, fast, f"dequantize_nvfp4 of quantized data col={columnwise}")


def test_dequantize_nvfp4_rejects_the_same_calls(fastpath_backend, reference_backend, cuda):
    data, scale, amax = random_bytes((32, 16), cuda), random_bytes((128, 4), cuda), torch.ones(1, device=cuda)
    for shape in ((32, 31), (32, 48)):
        assert_same_error(reference_backend, fastpath_backend, "dequantize_nvfp4", data, scale, amax, shape=shape,
                          columnwise=False, e4m3_max=448.0, out_dtype=torch.float32)
