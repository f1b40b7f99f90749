"""Per-tensor FP8 quantizers whose defect is a PyTorch primitive they rely on, as it behaved before its fix.

Each quantizer is TE's (``docs/recipes/current-scaling.md#the-arithmetic``) and leans on one torch op for one
edge case; the bug replaces that op by its behaviour before the PyTorch fix, written out in plain torch:

* the saturating clamp before the cast (pytorch/pytorch#15338): CUDA's ``clamp(x, lo, hi)`` tested
  ``x < hi`` first, so NaN failed the test and came out as ``hi``; the fix reordered the tests so that
  NaN falls through both;
* the E4M3 cast itself (pytorch/pytorch#178817): a delayed-scaling kernel that relies on the cast to
  saturate (TE's ``satfinite``) got NaN from the CPU conversion for every finite value past 464 (the
  rounding midpoint above 448) and for inf; the fix saturates to +-448. The twin is the fixed cast,
  torch's own since 2.12 (this corpus runs on 2.13).
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import check_quantizer

from .cases import RecallCase

FLT_MAX = torch.finfo(torch.float32).max


def _clamp(x: torch.Tensor, lo: float, hi: float, nan_to_upper: bool) -> torch.Tensor:
    if nan_to_upper:  # t = x < hi ? x : hi; t > lo ? t : lo  -- NaN fails the first test
        t = torch.where(x < hi, x, torch.full_like(x, hi))
        return torch.where(t > lo, t, torch.full_like(x, lo))
    t = torch.where(x > hi, torch.full_like(x, hi), x)  # the fixed order: NaN fails both tests and stays
    return torch.where(t < lo, torch.full_like(x, lo), t)


def current_scaling_with_clamp(x: torch.Tensor, quantizer: Any, nan_to_upper: bool
                               ) -> tuple[torch.Tensor, torch.Tensor]:
    magnitudes = x.float().abs()
    amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax().reshape(1)
    scale = torch.tensor([quantizer.fmax]) / amax
    scale = torch.where((amax == 0) | torch.isinf(amax), 1.0, scale)
    scale = torch.where(torch.isinf(scale), FLT_MAX, scale)
    data = _clamp(x.float() * scale, -quantizer.fmax, quantizer.fmax, nan_to_upper).to(torch.float8_e4m3fn)
    if quantizer.columnwise_usage:
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, torch.reciprocal(scale)


def _e4m3_cast(v: torch.Tensor, overflow_to_nan: bool) -> torch.Tensor:
    """fp32 -> E4M3 bytes; ``overflow_to_nan``: the CPU conversion before the fix (|v| > 464 or inf: NaN)."""
    codes = v.to(torch.float8_e4m3fn).view(torch.uint8)  # torch 2.13: round to nearest even, saturating
    if not overflow_to_nan:
        return codes
    nan_code = torch.where(torch.signbit(v), 0xFF, 0x7F).to(torch.uint8)  # the sign kept, as the old code did
    return torch.where(v.abs() > 464.0, nan_code, codes)


def delayed_scaling_relying_on_cast(x: torch.Tensor, quantizer: Any, overflow_to_nan: bool
                                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """Delayed scaling casts with the quantizer's scale; past the max, only the cast's saturation helps."""
    data = _e4m3_cast(x.float() * quantizer.scale, overflow_to_nan)
    if quantizer.columnwise_usage:
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, torch.reciprocal(quantizer.scale)


def _check_clamp(nan_to_upper: bool) -> Any:
    return check_quantizer(lambda x, quantizer: current_scaling_with_clamp(x, quantizer, nan_to_upper),
                           te.recipe.Float8CurrentScaling(), output="data_and_scale_inv")


def _check_cast(overflow_to_nan: bool) -> Any:
    return check_quantizer(lambda x, quantizer: delayed_scaling_relying_on_cast(x, quantizer, overflow_to_nan),
                           te.recipe.DelayedScaling(), output="data_and_scale_inv")


CASES = [
    RecallCase("fp8_clamp_maps_nan_to_upper_bound", "https://github.com/pytorch/pytorch/issues/15338", "quantizer",
               "the saturating clamp before the cast tests x < max first, so a NaN input comes out as +max "
               "(code 0x7E) instead of NaN", lambda: _check_clamp(True), lambda: _check_clamp(False)),
    RecallCase("e4m3_cast_overflows_to_nan", "https://github.com/pytorch/pytorch/pull/178817", "quantizer",
               "a delayed-scaling kernel relies on the E4M3 cast to saturate, but the cast gives NaN for finite "
               "values past 464 and for inf, where TE's satfinite gives +-448",
               lambda: _check_cast(True), lambda: _check_cast(False)),
]
