"""torchao float8 training (tensorwise current scaling) computed in the input's precision.

Before pytorch/ao#904, ``hp_tensor_to_float8_dynamic`` took the amax of a bf16 (or fp16) tensor in
that dtype, divided ``fmax / amax`` in that dtype and upcast the scale to fp32 only at the end; the
cast then multiplied the bf16 tensor by the 0-dim fp32 scale, which type promotion keeps in bf16.
So the scale is rounded to bf16 and every scaled value is rounded to bf16 before the FP8 cast.
The fix upcasts first (the amax to float64, the tensor to fp32). Re-created here inside TE's order
of operations (``docs/recipes/current-scaling.md#the-arithmetic``); the twin is that order with the fix,
fp32 from the start.
"""

from __future__ import annotations

from typing import Any

import torch

import refops as te
from refops.testing import check_quantizer

from .cases import RecallCase


def tensorwise_cast(x: torch.Tensor, quantizer: Any, upcast_first: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(E4M3 data, scale_inv)``; ``upcast_first=False`` does the arithmetic in x's dtype (the bug)."""
    hp = x.float() if upcast_first else x
    magnitudes = hp.abs()
    amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax()  # 0-dim, as torch.max(abs(x)) is
    scale = torch.tensor(quantizer.fmax, dtype=amax.dtype) / amax  # in x's dtype when not upcast (the bug)
    scale = torch.where((amax == 0) | torch.isinf(amax), torch.ones_like(scale), scale)
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, torch.finfo(scale.dtype).max), scale)
    scale = scale.to(torch.float32)  # the bug upcasts only here
    scaled = hp * scale  # a bf16 tensor times a 0-dim fp32 tensor stays bf16 (the bug)
    data = scaled.float().clamp(-quantizer.fmax, quantizer.fmax).to(torch.float8_e4m3fn)
    if quantizer.columnwise_usage:  # per-tensor: the transpose of the same bytes
        data = data.reshape(-1, x.shape[-1]).t().contiguous()
    return data, torch.reciprocal(scale).reshape(1)


def _check(upcast_first: bool) -> Any:
    return check_quantizer(lambda x, quantizer: tensorwise_cast(x, quantizer, upcast_first),
                           te.recipe.Float8CurrentScaling(), output="data_and_scale_inv")


CASES = [
    RecallCase("fp8_tensorwise_scale_in_input_dtype", "https://github.com/pytorch/ao/pull/904", "quantizer",
               "torchao's dynamic cast takes amax, fmax/amax and x * scale in the bf16/fp16 input dtype, "
               "upcasting only at the end: the scale and the scaled values are rounded to bf16 first",
               lambda: _check(False), lambda: _check(True)),
]
