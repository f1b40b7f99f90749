"""FP8 block scaling (1x128 blocks, power-of-two fp32 scales) and a scale_inv built from exponent bits.

The fixed quantizer follows ``docs/recipes/fp8-block.md#the-arithmetic``: per block, scale = RN(fmax / amax), the input
dtype's max when that overflows, the mantissa masked off (a power of two, rounded down), and
scale_inv = 1 / scale. The bug derives scale_inv from the scale's biased exponent instead, which
has no encoding for 1 / 2^127 = 2^-127: a subnormal, whose exponent field is 0.
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import check_quantizer

from .cases import RecallCase

_BLOCK = 128


def _pow2_scale(amax: torch.Tensor, input_dtype: torch.dtype) -> torch.Tensor:
    scale = 448.0 / amax
    scale = torch.where((amax == 0) | torch.isinf(amax) | torch.isnan(amax), 1.0, scale)
    scale = torch.where(torch.isinf(scale), torch.finfo(input_dtype).max, scale)
    return (scale.view(torch.int32) & 0x7F800000).view(torch.float32)  # drop the mantissa: round down


def _scale_inv(scale: torch.Tensor, from_exponent_bits: bool) -> torch.Tensor:
    if not from_exponent_bits:
        return torch.reciprocal(scale)  # exact for a power of two, 2^-127 included
    biased = (scale.view(torch.int32) >> 23) & 0xFF
    inverse = (254 - biased).clamp(min=0) << 23  # 2^(127-e) from its exponent alone: 2^-127 becomes 0
    return inverse.view(torch.float32)


def block_quantize(x: torch.Tensor, quantizer: Any, from_exponent_bits: bool) -> torch.Tensor:
    """The dequantized values of ``x`` under 1x128 blocks (128x1 for the column-wise orientation)."""
    rows = x.float().reshape(-1, x.shape[-1])
    if quantizer.columnwise_usage:
        rows = rows.t()
    m, k = rows.shape
    padded = torch.nn.functional.pad(rows, (0, -k % _BLOCK))  # edge blocks: amax over in-bounds values only
    blocks = padded.reshape(m, -1, _BLOCK)
    magnitudes = blocks.abs()
    amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax(-1, keepdim=True)
    scale = _pow2_scale(amax, x.dtype)
    data = (blocks * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    values = (data.float() * _scale_inv(scale, from_exponent_bits)).reshape(m, -1)[:, :k]
    if quantizer.columnwise_usage:
        values = values.t()
    return values.reshape(x.shape).to(x.dtype)


def _check(from_exponent_bits: bool) -> Any:
    def candidate(x, quantizer):
        return block_quantize(x, quantizer, from_exponent_bits)

    return check_quantizer(candidate, te.recipe.Float8BlockScaling(), output="dequantized")


CASES = [
    RecallCase("fp8_block_scale_inv_from_exponent_bits", "https://github.com/NVIDIA/TransformerEngine/pull/2589",
               "quantizer", "a tiny block amax gives the pow2 scale 2^127; reading 1/scale off its exponent bits "
               "gives 0 instead of the subnormal 2^-127",
               lambda: _check(True), lambda: _check(False)),
]
