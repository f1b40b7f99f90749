"""Whether the fast path can run here, and if not, why."""

from __future__ import annotations

import functools

import torch

__all__ = ["is_available", "unavailable_reason"]


@functools.lru_cache(maxsize=1)
def unavailable_reason() -> str:
    """Empty when the fast path can run; otherwise the reason, the first that applies: no CUDA GPU (torch sees
    none; with a CPU-only build of torch, it sees none even on a GPU machine), then CuPy missing, then CuPy
    unable to reach the GPU. The install hint for CuPy comes only where a GPU is there for it to use."""
    if not torch.cuda.is_available():
        if torch.version.cuda is None:
            return (f"no CUDA GPU: this torch ({torch.__version__}) is a CPU-only build, which sees no GPU; "
                    "the fast path needs a CUDA GPU and a CUDA build of torch")
        return "no CUDA GPU on this machine (torch sees none); the fast path needs one"
    try:
        import cupy
    except ImportError as exc:
        return f"CuPy is not installed ({exc}); install refops with the cuda12 or cuda13 extra"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:  # CuPy raises its own CUDARuntimeError types
        return f"CuPy cannot reach a CUDA device ({exc})"
    return ""


def is_available(return_reason: bool = False) -> bool | tuple[bool, str]:
    """True when CuPy and a CUDA device are present; with ``return_reason``, ``(ok, reason)``."""
    reason = unavailable_reason()
    return (not reason, reason) if return_reason else not reason
