"""Whether the fast path can run here, and if not, why."""

from __future__ import annotations

import functools

import torch

__all__ = ["is_available", "unavailable_reason"]


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str:
    """Empty when the fast path can run; otherwise the reason (CuPy missing, no GPU...)."""
    try:
        import cupy  # noqa: F401
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install refops with the cuda12 or cuda13 extra"
    if not torch.cuda.is_available():
        return "torch reports no CUDA device"
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError types
        return f"CuPy cannot reach a CUDA device ({exc})"
    return ""


def is_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """True when CuPy and a CUDA device are present; with ``return_reason``, ``(ok, reason)``."""
    reason = unavailable_reason()
    return (not reason, reason) if return_reason else not reason
