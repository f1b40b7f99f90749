"""A failing run of :func:`refops.testing.check_quantizer` explained: the stored layouts handed to
:func:`refops.testing.format_diagnosis.diagnose_mismatch` in the form it reads.

``diagnose_mismatch`` works on codes and scales that tile each other in row-major
order. The reference's stored layouts do not all do so (``docs/recipes/index.md#stored-layouts``:
column-wise FP8 and NVFP4 data transposed, FP8 block scaling's 1-D scales
in the GEMM-ready ``(K / 128, M)``), so this module brings both results to the
nominal ``(M, K)`` view first; only the check for a transposed result looks at the
candidate's data as stored.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...formats import unpack_e2m1
from ...quantization import Float8Tensor, MXFP8Tensor, NVFP4Tensor, QuantizedTensor
from ..format_diagnosis import diagnose_mismatch
from . import layout

__all__ = ["diagnose_run"]


def _nominal_scale_grid(qt: QuantizedTensor, usage: str, scale: torch.Tensor) -> tuple[torch.Tensor, Optional[tuple[int, int]]]:
    """The scale grid in the ``(M, K)`` view (transposed where it is stored transposed), and its block."""
    col = usage == "columnwise"
    if isinstance(qt, Float8Tensor):
        return scale, None
    if isinstance(qt, MXFP8Tensor):
        return scale, (32, 1) if col else (1, 32)
    if isinstance(qt, NVFP4Tensor):
        return (scale.t(), (16, 1)) if col else (scale, (1, 16))
    if qt._is_2D_scaled:
        return (scale.t() if col else scale), (128, 128)
    return (scale, (128, 1)) if col else (scale.t(), (1, 128))


def _element_format(qt: QuantizedTensor) -> Any:
    return "E2M1" if isinstance(qt, NVFP4Tensor) else qt._fp8_dtype


def _stored_codes(qt: QuantizedTensor, data: torch.Tensor) -> torch.Tensor:
    """``data`` as one code a byte in its own 2-D shape (NVFP4 unpacked when packed)."""
    bits = layout.as_bits(data.detach().cpu())
    bits = bits.reshape(-1, bits.shape[-1]) if bits.dim() > 1 else bits.reshape(1, -1)
    if isinstance(qt, NVFP4Tensor) and bits.numel() * 2 == qt.numel():
        bits = unpack_e2m1(bits)
    return bits


def _transposed_in_storage(qt: QuantizedTensor, usage: str) -> bool:
    return usage == "columnwise" and not isinstance(qt, MXFP8Tensor)


def diagnose_run(reference: QuantizedTensor, usage: str, expected: dict[str, Any], got: dict[str, Any],
                 x: Optional[torch.Tensor]) -> str:
    """The sentence :func:`~refops.testing.format_diagnosis.diagnose_mismatch` gives for this run, or "".

    ``x`` is the high-precision tensor both sides quantized; None when it is unknown (the reference's
    dequantized values stand in for it)."""
    fmt = _element_format(reference)
    exp_nominal = layout.element_codes(reference, usage, expected["data"].cpu())
    exp_stored = exp_nominal.t() if _transposed_in_storage(reference, usage) else exp_nominal
    got_stored = _stored_codes(reference, got["data"])
    try:
        if got_stored.shape == exp_stored.shape[::-1] and got_stored.shape != exp_stored.shape:
            return diagnose_mismatch(exp_stored, got_stored, expected["scale_inv"], got["scale_inv"],
                                     expected_format=fmt) or ""
        got_nominal = layout.element_codes(reference, usage, got["data"].detach().cpu())
        exp_grid, block = _nominal_scale_grid(reference, usage, expected["scale_inv"].detach().cpu())
        got_grid, _ = _nominal_scale_grid(reference, usage, got["scale_inv"].detach().cpu())
        values = None if x is None else x.detach().cpu().reshape(exp_nominal.shape)
        return diagnose_mismatch(exp_nominal, got_nominal, exp_grid, got_grid, expected_format=fmt, values=values,
                                 scale_block=block) or ""
    except (TypeError, ValueError, RuntimeError):  # a result that does not line up: the counts say enough
        return ""
