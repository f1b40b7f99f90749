"""NVFP4 (E2M1 codes, E4M3 1x16 block scales, an fp32 global scale) and a global scale used backwards.

The fixed quantizer is ``docs/recipes/nvfp4.md#the-arithmetic``, standard path, without the RHT: S_enc = RN(2688 / A)
for the tensor's amax A; per block of 16, s_b = E4M3(RN(b * RN(S_enc * fl(1/6)))) and
enc_b = min(RN(1 / RN(s_b * S_dec)), FLT_MAX); codes are E2M1(RN(x * enc_b)), ties to even. The bug
hands the block-scale step the decode factor S_dec = 1 / S_enc where the encode factor belongs.
"""

from __future__ import annotations

from typing import Any

import torch

from refops.quantization import NVFP4Quantizer
from refops.testing import check_quantizer

from .cases import RecallCase

FLT_MAX = torch.finfo(torch.float32).max
_SIXTH = torch.tensor([1.0 / 6.0], dtype=torch.float32)  # fl(1/6) = 0x3E2AAAAB
# E2M1 magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6: a value's code is how many thresholds it passes. The
# midpoints that round up (to the even code) pass at >=, those that round down only at >.
_UP, _DOWN = torch.tensor([0.75, 1.75, 3.5]), torch.tensor([0.25, 1.25, 2.5, 5.0])


def _e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    magnitude = v.abs().unsqueeze(-1)
    code = (magnitude >= _UP).sum(-1) + (magnitude > _DOWN).sum(-1)
    code = torch.where(torch.isnan(v), 7, code)  # NaN saturates to +6
    negative = torch.signbit(v) & ~torch.isnan(v)
    return (code + 8 * negative.to(code.dtype)).to(torch.uint8)


def _global_scales(amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    s_enc = torch.tensor([2688.0]) / amax
    s_enc = torch.where(torch.isinf(s_enc), FLT_MAX, s_enc)
    s_enc = torch.where((amax == 0) | torch.isinf(amax), 1.0, s_enc)
    return s_enc, torch.reciprocal(s_enc)


def nvfp4_quantize(x: torch.Tensor, quantizer: Any, decode_factor_for_encode: bool, *,
                   encode_by_division: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(one E2M1 code a byte, E4M3 block-scale bytes, amax)``; column-wise is the transpose, blocked along M.

    The block's encode factor is ``min(RN(1 / RN(s_b * S_dec)), FLT_MAX)``; ``encode_by_division`` is TE #2639's
    tuned kernel for bf16 inputs, ``min(RN(S_enc / s_b), FLT_MAX)``: equal on paper, one ulp apart in fp32."""
    rows = x.float().reshape(-1, x.shape[-1])
    if quantizer.columnwise_usage:
        rows = rows.t()
    m, k = rows.shape
    if k % 16:
        raise ValueError(f"NVFP4 needs the blocked dim divisible by 16, got {k}")
    magnitudes = rows.abs()
    amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax().reshape(1)
    s_enc, s_dec = _global_scales(amax)
    blocks = rows.reshape(m, k // 16, 16)
    block_amax = torch.where(torch.isnan(blocks.abs()), 0.0, blocks.abs()).amax(-1, keepdim=True)
    per_block = (s_dec if decode_factor_for_encode else s_enc) * _SIXTH
    block_scale = (block_amax * per_block).clamp(max=448.0).to(torch.float8_e4m3fn)
    if encode_by_division and x.dtype == torch.bfloat16:  # the tuned kernel ran for bf16 inputs only
        encode = (s_enc / block_scale.float()).clamp(max=FLT_MAX)
    else:
        encode = torch.reciprocal(block_scale.float() * s_dec).clamp(max=FLT_MAX)
    codes = _e2m1_codes(blocks * encode).reshape(m, k)
    return codes, block_scale.squeeze(-1).view(torch.uint8), amax


def _check(decode_factor_for_encode: bool) -> Any:
    def candidate(x, quantizer):
        return nvfp4_quantize(x, quantizer, decode_factor_for_encode)

    return check_quantizer(candidate, NVFP4Quantizer(), output="data_and_scale_inv")


CASES = [
    RecallCase("nvfp4_global_scale_direction", "https://github.com/vllm-project/vllm/pull/55643", "quantizer",
               "the per-tensor global scale is passed in decode direction (1/S_enc) where the block-scale "
               "step expects S_enc", lambda: _check(True), lambda: _check(False)),
]
