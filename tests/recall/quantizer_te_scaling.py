"""TransformerEngine's own quantizer bugs: a recorded amax, an NVFP4 encode factor, an E8M0 decode.

Each candidate is a plain-torch re-creation of the kernel as the fix describes it, handed to
``check_quantizer`` with its default matrix; the twin differs only by the fix.
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.quantization import DType, Float8Quantizer, NVFP4Quantizer
from refops.testing import check_quantizer

from .cases import RecallCase
from .quantizer_mxfp8 import mxfp8_quantize
from .quantizer_nvfp4 import nvfp4_quantize


# ------------------------------------------------------------------ TE #534: calibration's amax
def delayed_cast_recording_amax(x: torch.Tensor, quantizer: Any, signed_max: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Delayed scaling: cast with the quantizer's scale, record this tensor's amax for the next scale.

    TE's FP8 calibration wrote ``torch.amax(x)`` into the amax history: the largest signed value,
    not the largest magnitude (fix: ``max(-amin, amax)``). NaN is dropped in both.
    """
    values = torch.where(torch.isnan(x), 0.0, x.float())
    seen = values.max() if signed_max else values.abs().max()
    quantizer.amax.copy_(torch.fmax(quantizer.amax, seen.reshape(1)))
    fmax = quantizer.fmax
    data = (x.float() * quantizer.scale).clamp(-fmax, fmax)
    data = data.to(torch.float8_e4m3fn if fmax == 448.0 else torch.float8_e5m2)
    if quantizer.columnwise_usage:
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, torch.reciprocal(quantizer.scale)


def _check_calibration(signed_max: bool) -> Any:
    return check_quantizer(lambda x, q: delayed_cast_recording_amax(x, q, signed_max), te.recipe.DelayedScaling(),
                           output="data_and_scale_inv")


def _recorded_amaxes_differ() -> bool:
    x = -torch.rand(4, 32) - 1.0  # all negative: the signed max is below every magnitude
    amaxes = []
    for signed_max in (True, False):
        quantizer = Float8Quantizer(torch.ones(1), torch.zeros(1), DType.kFloat8E4M3)
        delayed_cast_recording_amax(x, quantizer, signed_max)
        amaxes.append(quantizer.amax.clone())
    return not torch.equal(*amaxes)


# ------------------------------------------------------------------ TE #2639: NVFP4 tuned kernel
def nvfp4_tuned_quantize(x: torch.Tensor, quantizer: Any, encode_by_division: bool
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 1D (no RHT), the corpus's quantizer; ``encode_by_division`` is TE's tuned kernel before the fix."""
    return nvfp4_quantize(x, quantizer, False, encode_by_division=encode_by_division)


def _check_nvfp4(encode_by_division: bool) -> Any:
    return check_quantizer(lambda x, q: nvfp4_tuned_quantize(x, q, encode_by_division), NVFP4Quantizer(),
                           output="data_and_scale_inv")


# ------------------------------------------------------------------ TE #3262: E8M0 decode
def _e8m0_decode(exponent: torch.Tensor, shift_only: bool) -> torch.Tensor:
    """``2^(e-127)`` as fp32. Shifting ``e`` into the exponent field (the bug) makes code 0 +0.0 (not the
    subnormal 2^-127) and code 255 +inf (not NaN)."""
    e = exponent.to(torch.int32)
    bits = e << 23
    if not shift_only:
        bits = torch.where(e == 0, 0x00400000, bits)
        bits = torch.where(e == 255, 0x7FC00000, bits)
    return bits.view(torch.float32)


def mxfp8_dequantize(x: torch.Tensor, quantizer: Any, shift_only: bool) -> torch.Tensor:
    """MXFP8 quantize (the fixed encoding of :mod:`.quantizer_mxfp8`), then TE's software dequantize."""
    data, exponents = mxfp8_quantize(x, quantizer)
    rows = data.float().reshape(-1, x.shape[-1])
    scale = _e8m0_decode(exponents, shift_only)
    if quantizer.columnwise_usage:  # 32x1 blocks: one scale row per 32 data rows
        scale = scale.repeat_interleave(32, dim=0)
    else:
        scale = scale.repeat_interleave(32, dim=1)
    return (rows * scale).reshape(x.shape).to(x.dtype)


def _check_e8m0_decode(shift_only: bool) -> Any:
    return check_quantizer(lambda x, q: mxfp8_dequantize(x, q, shift_only), te.recipe.MXFP8BlockScaling(),
                           output="dequantized")


CASES = [
    RecallCase("calibration_amax_is_signed_max", "https://github.com/NVIDIA/TransformerEngine/pull/534", "quantizer",
               "FP8 calibration records torch.amax(x), the largest signed value, into the amax history "
               "instead of max |x|: a negative-heavy tensor gets a scale that saturates it",
               lambda: _check_calibration(True), lambda: _check_calibration(False), _recorded_amaxes_differ),
    RecallCase("nvfp4_tuned_kernel_encode_by_division", "https://github.com/NVIDIA/TransformerEngine/pull/2639",
               "quantizer", "the tuned NVFP4 kernel (bf16 inputs) takes the block encode factor as S_enc / s_b "
               "instead of 1 / (s_b * S_dec): one ulp apart, other E2M1 codes near rounding boundaries",
               lambda: _check_nvfp4(True), lambda: _check_nvfp4(False)),
    RecallCase("mxfp8_dequantize_e8m0_code_zero_as_zero", "https://github.com/NVIDIA/TransformerEngine/pull/3262",
               "quantizer", "MXFP8 dequantize builds 2^(e-127) by shifting e into the exponent field: scale byte "
               "0 decodes to 0 instead of 2^-127, zeroing every block of tiny values",
               lambda: _check_e8m0_decode(True), lambda: _check_e8m0_decode(False)),
]
