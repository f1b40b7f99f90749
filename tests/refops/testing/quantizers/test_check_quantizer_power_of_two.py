"""check_quantizer's ``amax_near_power_of_two`` case: block amaxes at and one ulp around the amaxes where a
power-of-two scale steps an octave, where a scale taken with float ``log2`` loses the step (sglang #31210)."""

from __future__ import annotations

import pytest
import torch

from refops.quantization import DType, Float8CurrentScalingQuantizer, MXFP8Quantizer, NVFP4Quantizer
from refops.quantization.quantizer import torch_fp8_dtype
from refops.testing import check_quantizer
from refops.testing.quantizers.cases import CASES, block_length, power_of_two_boundary

CASE = next(c for c in CASES if c.name == "amax_near_power_of_two")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _one_ulp(value: torch.Tensor, steps: int) -> torch.Tensor:
    bits = torch.int32 if value.dtype == torch.float32 else torch.int16
    return (value.view(bits) + steps).view(value.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("quantizer", [MXFP8Quantizer(DType.kFloat8E4M3), MXFP8Quantizer(DType.kFloat8E5M2),
                                       NVFP4Quantizer()], ids=["mxfp8-e4m3", "mxfp8-e5m2", "nvfp4"])
def test_every_block_amax_is_at_or_one_ulp_around_a_boundary_in_both_orientations(quantizer, dtype):
    x = CASE.build(dtype, quantizer, torch.Generator().manual_seed(0))
    assert x.dtype == dtype and bool(torch.isfinite(x).all())
    base, length = power_of_two_boundary(quantizer), block_length(quantizer)
    at = torch.tensor([base * 2.0**k for k in range(-8, 9)], dtype=dtype)
    above, below = _one_ulp(at, 1).float(), _one_ulp(at, -1).float()
    rows = x.float().abs().reshape(64, -1, length).amax(-1)
    columns = x.float().abs().t().reshape(128, -1, length).amax(-1)
    for amaxes in (rows, columns):
        on_each_side = [torch.isin(amaxes, side) for side in (at.float(), above, below)]
        assert bool((on_each_side[0] | on_each_side[1] | on_each_side[2]).all())
        assert all(bool(side.any()) for side in on_each_side)
        assert len(amaxes.unique()) >= 3 * 5  # several octaves
    # the tensor's amax one ulp above a boundary: where a per-tensor pow2 scale must drop an octave
    assert bool(torch.isin(x.float().abs().max(), above))


def _per_tensor_pow2(float_log2: bool):
    """Current scaling with power-of-two scales, ``s = 2^floor(log2(fmax / amax))``: from ``fmax / amax``'s
    exponent bits (TE), or with float ``log2``, which rounds ``log2(2^-k (1 - 2^-23))`` onto ``-k``."""
    def quantize(x, quantizer):
        fp8 = torch_fp8_dtype(quantizer.dtype)
        fmax = torch.finfo(fp8).max
        ratio = torch.tensor([fmax], dtype=torch.float32) / x.float().abs().amax().reshape(1)
        if float_log2:
            scale = torch.exp2(torch.floor(torch.log2(ratio)))
        else:
            scale = (ratio.view(torch.int32) & 0x7F800000).view(torch.float32)
        data = (x.float() * scale).clamp(-fmax, fmax).to(fp8)
        if quantizer.columnwise_usage:
            data = data.reshape(-1, x.shape[-1]).t().contiguous()
        return data, torch.reciprocal(scale)

    return quantize


@pytest.mark.parametrize("fp8_dtype", [DType.kFloat8E4M3, DType.kFloat8E5M2], ids=["e4m3", "e5m2"])
def test_a_pow2_scale_from_float_log2_fails_only_on_this_case_and_its_twin_passes(fp8_dtype):
    quantizer = Float8CurrentScalingQuantizer(fp8_dtype, force_pow_2_scales=True)
    cases = ["normal", "large", "wide_scales", "amax_near_power_of_two"]
    buggy = check_quantizer(_per_tensor_pow2(float_log2=True), quantizer, cases=cases, layouts=[])
    assert {(r.case, r.dtype) for r in buggy.failures} == {("amax_near_power_of_two", "float32")}
    # bf16 / fp16 amaxes one of their ulps above the boundary are far enough from it for float log2
    check_quantizer(_per_tensor_pow2(float_log2=False), quantizer, cases=cases, layouts=[]).assert_ok()
