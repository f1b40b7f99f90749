"""Per-tensor FP8 current scaling: plain-torch quantizers, each one fix away from TE's kernel.

``current_scaling(x, quantizer, defect)`` is TE's order of operations
(``docs/recipes/index.md#the-scale-from-an-amax``): amax without NaN, scale = RN(fmax / amax), scale 1
for an amax of 0 or inf, FLT_MAX when the scale
overflows, multiply, clamp, cast. Each ``defect`` undoes exactly one of those steps, the way a
shipped kernel did.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import refops as te
from refops.testing import check_quantizer

from .cases import RecallCase

FLT_MAX = torch.finfo(torch.float32).max
_TORCH_FP8 = {448.0: torch.float8_e4m3fn, 57344.0: torch.float8_e5m2}


def current_scaling(x: torch.Tensor, quantizer: Any, defect: Optional[str] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(data, scale_inv)`` of ``x`` under the quantizer's format, with at most one ``defect``."""
    fmax = 448.0 if defect == "e4m3_for_grads" else quantizer.fmax
    magnitudes = x.float().abs()
    if defect != "nan_in_amax":
        magnitudes = torch.where(torch.isnan(magnitudes), 0.0, magnitudes)
    amax = magnitudes.amax().reshape(1)
    if defect == "divide_by_scale_inv":
        scale_inv = amax / fmax
        scaled = x.float() / scale_inv
    else:
        scale = torch.tensor([fmax]) / amax
        if defect != "no_unit_scale_guard":
            scale = torch.where((amax == 0) | torch.isinf(amax), 1.0, scale)
        if defect != "no_overflow_guard":
            scale = torch.where(torch.isinf(scale), FLT_MAX, scale)
        scale_inv = torch.reciprocal(scale)
        scaled = x.float() * scale
    if defect != "no_saturation":
        scaled = scaled.clamp(-fmax, fmax)  # clamp keeps NaN
    data = scaled.to(_TORCH_FP8[fmax])
    if quantizer.columnwise_usage:  # per-tensor: the column-wise copy is the transpose of the same bytes
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, scale_inv


def _check(defect: Optional[str], role: str = "input") -> Any:
    def candidate(x, quantizer):
        return current_scaling(x, quantizer, defect)

    return check_quantizer(candidate, te.recipe.Float8CurrentScaling(), role=role, output="data_and_scale_inv")


def _case(name: str, url: str, summary: str, defect: str, role: str = "input") -> RecallCase:
    return RecallCase(name, url, "quantizer", summary, lambda: _check(defect, role), lambda: _check(None, role))


CASES = [
    _case("fp8_scale_by_division", "https://github.com/ROCm/vllm/pull/381",
          "current scaling divides by amax/fmax instead of multiplying by RN(fmax/amax): other bytes on ties",
          "divide_by_scale_inv"),
    _case("fp8_amax_propagates_nan", "https://github.com/flagos-ai/TransformerEngine-FL/pull/110",
          "the amax is a plain max over |x|, so one NaN makes the scale and every code NaN",
          "nan_in_amax"),
    _case("fp8_scale_not_one_for_zero_or_inf_amax", "https://github.com/flagos-ai/TransformerEngine-FL/pull/110",
          "no 'scale = 1' guard: an all-zero tensor gets scale FLT_MAX and an inf amax scale 0",
          "no_unit_scale_guard"),
    _case("fp8_tiny_amax_infinite_scale", "https://github.com/NVIDIA/TransformerEngine/pull/786",
          "fmax / amax overflows to inf for a tiny amax and is used as is, instead of FLT_MAX",
          "no_overflow_guard"),
    _case("fp8_cast_without_saturation", "https://github.com/vllm-project/vllm/pull/4570",
          "no clamp before the cast: E5M2 grads past the max become inf where TE saturates",
          "no_saturation", role="grad_output"),
    _case("fp8_hybrid_grads_cast_to_e4m3", "https://github.com/NVIDIA/TransformerEngine/issues/3342",
          "under Format.HYBRID the grad quantizer writes E4M3 bytes where the recipe asks for E5M2",
          "e4m3_for_grads", role="grad_output"),
]
