"""MXFP8 (1x32 blocks, E8M0 scales): a plain-torch quantizer and three shipped ways to get the scale wrong.

The fixed encoding is TE's (``docs/recipes/formats.md#e8m0``): v = RN(amax * fl(1/fmax)) in fp32, then the
power of two at or above v, taken from v's bits (not from ``log2``, not through bf16, not floor).
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import refops as te
from refops.testing import check_quantizer

from .cases import RecallCase

_INV_FMAX = torch.tensor([1.0 / 448.0], dtype=torch.float32)  # fl(1/448) = 0x3B124925


def _e8m0_round_up(v: torch.Tensor) -> torch.Tensor:
    """The biased exponent of the power of two at or above ``v`` (fp32), saturating at 2^127."""
    bits = v.view(torch.int32)
    exponent, mantissa = (bits >> 23) & 0xFF, bits & 0x7FFFFF
    up = (mantissa > 0) & (exponent != 254) & ~((exponent == 0) & (mantissa <= 0x400000))
    e = exponent + up.to(torch.int32)
    e = torch.where(v == 0, 0, e)
    e = torch.where(torch.isinf(v), 0xFE, e)
    return torch.where(torch.isnan(v), 0xFF, e)


def _block_exponents(amax: torch.Tensor, defect: Optional[str]) -> torch.Tensor:
    if defect == "ocp_floor":  # the OCP rule: floor(log2 amax) minus E4M3's largest exponent, 8
        e = torch.floor(torch.log2(amax)) - 8 + 127
        return torch.where(amax == 0, 0, e.nan_to_num(nan=255.0).clamp(0, 254)).to(torch.int32)
    if defect == "log2_ceil":  # ceil(log2(v)) in floating point: log2 rounds near powers of two
        e = torch.ceil(torch.log2(amax * _INV_FMAX)) + 127
        return torch.where(amax == 0, 0, e.nan_to_num(nan=255.0).clamp(0, 254)).to(torch.int32)
    if defect == "through_bf16":  # the amax is rounded to bf16 before the scale is taken from it
        amax = amax.to(torch.bfloat16).float()
    return _e8m0_round_up(amax * _INV_FMAX)


def _pow2(exponent: torch.Tensor) -> torch.Tensor:
    """2^(exponent - 127) as fp32, built from bits so that 2^-127 (a subnormal) is exact."""
    normal = (exponent.clamp(1, 254) << 23).view(torch.float32)
    return torch.where(exponent == 0, torch.tensor(0x00400000, dtype=torch.int32).view(torch.float32), normal)


def mxfp8_quantize(x: torch.Tensor, quantizer: Any, defect: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4M3 data, E8M0 scale bytes)`` in TE's unpadded layout for the orientation asked."""
    rows = x.float().reshape(-1, x.shape[-1])
    m, k = rows.shape
    if m % 32 or k % 32:
        raise ValueError(f"MXFP8 needs both dims divisible by 32, got {tuple(rows.shape)}")
    columnwise = quantizer.columnwise_usage
    blocks = rows.t().reshape(k, m // 32, 32) if columnwise else rows.reshape(m, k // 32, 32)
    magnitudes = blocks.abs()
    amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax(-1)
    exponent = _block_exponents(amax, defect)
    multiplier = _pow2(254 - exponent)  # 2^(127 - e): exact, 2^127 for e = 0
    if defect == "rcp_of_zero_exponent_is_one":  # torchao #4117: exp2f_rcp's (biased_exp == 0) ? 1 : ...
        multiplier = torch.where(exponent == 0, 1.0, multiplier)
    data = (blocks * multiplier.unsqueeze(-1)).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    if columnwise:  # column-wise data keeps the (M, K) layout; its scales are (M/32, K)
        return data.reshape(k, m).t().contiguous().reshape(x.shape), exponent.t().contiguous().to(torch.uint8)
    return data.reshape(x.shape), exponent.to(torch.uint8)


def _check(defect: Optional[str]) -> Any:
    def candidate(x, quantizer):
        return mxfp8_quantize(x, quantizer, defect)

    return check_quantizer(candidate, te.recipe.MXFP8BlockScaling(), output="data_and_scale_inv")


def _exponents_differ(defect: str) -> bool:
    # block amaxes for which v = RN(amax * fl(1/448)) lies an ulp or two above a power of two
    amax = torch.tensor([229376.03125, 114688.015625, 0.4375000596046448])
    return not torch.equal(_block_exponents(amax, defect), _block_exponents(amax, None))


def _case(name: str, url: str, summary: str, defect: str) -> RecallCase:
    return RecallCase(name, url, "quantizer", summary, lambda: _check(defect), lambda: _check(None),
                      lambda: _exponents_differ(defect))


CASES = [
    _case("mxfp8_scale_floor_not_ceil", "https://github.com/ROCm/aiter/pull/3212",
          "the E8M0 block scale follows OCP's floor(log2 amax) - 8, not TE's round-up of amax/448, "
          "so block maxima clip", "ocp_floor"),
    _case("mxfp8_scale_through_bf16", "https://github.com/pytorch/ao/pull/4725",
          "the block amax is rounded to bf16 before the E8M0 exponent is taken: some amaxes cross "
          "the round-up threshold", "through_bf16"),
    _case("e8m0_scale_from_float_log2", "https://github.com/sgl-project/sglang/pull/31210",
          "the power-of-two scale is ceil(log2(v)) in floating point instead of v's exponent bits", "log2_ceil"),
]
