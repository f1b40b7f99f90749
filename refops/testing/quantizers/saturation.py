"""Whether a missing clamp before an FP8 cast can be seen on this torch, and which runs depend on the clamp.

TE's casts saturate (``satfinite``): a scaled value past the format's max, an
infinity included, becomes ``±max``. A plain-torch kernel gets that by clamping
before ``.to(float8)``. Whether it *forgot* the clamp shows only where torch's
own cast does something else with such a value: torch up to 2.11 gives NaN for
E4M3 (``|v| > 464``) and E5M2 gives inf (``|v| >= 61440``) on every version, but
from torch 2.13 the eager E4M3 cast saturates by itself
(``docs/recipes/index.md#the-cast``). There a kernel without the clamp writes exactly the
bytes of one with it, and no comparison of outputs can tell them apart; the
report says so instead of passing in silence.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from ...formats import e8m0_to_fp32
from ...quantization import MXFP8Tensor, NVFP4Tensor, QuantizedTensor, Quantizer
from ...quantization import NVFP4Quantizer
from ...quantization.quantizer import torch_fp8_dtype
from . import layout

__all__ = ["cast_dtype", "native_saturation", "elements_past_max", "describe"]


def cast_dtype(quantizer: Quantizer) -> torch.dtype:
    """The FP8 dtype a kernel of this scheme casts to with torch: the element format, or for NVFP4 the
    E4M3 of its block scales (its E2M1 elements have no torch dtype)."""
    if isinstance(quantizer, NVFP4Quantizer):
        return torch.float8_e4m3fn
    return torch_fp8_dtype(quantizer.dtype)


def _top_codes(dtype: torch.dtype) -> tuple[float, float, bool]:
    """The format's max, the value below it, and whether the max's code is odd (a tie above it rounds up)."""
    codes = torch.arange(0, 128, dtype=torch.uint8)
    values = codes.view(dtype).float()
    finite = torch.isfinite(values)
    top = int(torch.nonzero(finite)[-1])
    return float(values[top]), float(values[finite][-2]), bool(top & 1)


def native_saturation(dtype: torch.dtype, device: torch.device) -> dict[str, bool]:
    """How torch's own cast to ``dtype`` treats what a clamp would catch, on ``device``:
    ``{"finite": values past the max become ±max, "inf": infinities become ±max}``."""
    fmax, below, _ = _top_codes(dtype)
    past = 2 * fmax - below  # one step of the top binade past the max: never rounds back down
    probe = torch.tensor([past, -past, math.inf, -math.inf], dtype=torch.float32, device=device)
    got = probe.to(dtype).float().cpu().tolist()
    return {"finite": got[:2] == [fmax, -fmax], "inf": got[2:] == [fmax, -fmax]}


def elements_past_max(ref: QuantizedTensor, usage: str, x: torch.Tensor) -> int:
    """Elements of ``x`` whose scaled value the clamp decides: past the max plus half a step (where
    round-to-nearest stops reaching the max), or infinite. For NVFP4, the infinite inputs (their
    block scale, ``inf / 6``, is what gets clamped)."""
    values = x.detach().float().cpu().reshape(-1, x.shape[-1] if x.dim() else 1)
    if isinstance(ref, NVFP4Tensor):
        return int(torch.isinf(values).sum())
    dtype = torch_fp8_dtype(ref._fp8_dtype)
    fmax, below, max_code_odd = _top_codes(dtype)
    limit = fmax + (fmax - below) / 2
    fields = layout.usage_fields(ref, usage)
    if fields["scale_inv"] is None:
        return 0
    bits = layout.element_scales(ref, usage, fields["scale_inv"].detach().cpu())
    scale_inv = e8m0_to_fp32(bits.contiguous()) if isinstance(ref, MXFP8Tensor) else bits.view(torch.float32)
    scaled = values.double().abs() / scale_inv.double()
    past = (scaled > limit) | ((scaled == limit) & max_code_odd)
    return int(past.sum())


def describe(quantizer: Quantizer, saturation: dict[str, bool], runs_past_max: dict[str, int]) -> tuple[
        Optional[str], Optional[str]]:
    """``(compared, not_compared)`` sentences about the clamp, for the report (None: nothing to say).

    ``runs_past_max`` maps each case to how many of its compared runs hold values the clamp decides.
    """
    if not runs_past_max:
        return None, None
    dtype = cast_dtype(quantizer)
    name = str(dtype).removeprefix("torch.")
    what = "the E4M3 cast of NVFP4's block scales" if isinstance(quantizer, NVFP4Quantizer) else f"the cast to {name}"
    fmax = _top_codes(dtype)[0]
    count = sum(runs_past_max.values())
    where = f"{count} compared run{'s' if count != 1 else ''} ({', '.join(runs_past_max)})"
    hidden = [kind for kind, label in (("finite", "finite values past the max"), ("inf", "infinities"))
              if saturation[kind]]
    if not hidden:
        return (f"saturation: the clamp to ±{fmax:g} before {what} is visible on this torch (its own cast gives "
                f"NaN or inf there), in {where}"), None
    labels = {"finite": "finite values past the max", "inf": "infinities"}
    return None, (
        f"saturation: not distinguishable on this torch ({torch.__version__}): {what} saturates "
        f"{' and '.join(labels[k] for k in hidden)} to ±{fmax:g} by itself, so a candidate that omits the clamp "
        f"before casting writes the same bytes as one that clamps, in {where}; torch <= 2.11's E4M3 cast, and a "
        "CUDA cast without satfinite, give NaN there: check the clamp on such a torch, or read the kernel"
    )
