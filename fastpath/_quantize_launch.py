"""What every quantization kernel family of the fast path launches with: input checks, grid shapes, a launch."""

from __future__ import annotations

from typing import Any

import torch

from refops.layouts import ceil_div

from . import _cuda
from ._cuda import get_kernel, launch

_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_THREADS = 256


def _on_cuda(*tensors: torch.Tensor | None) -> bool:
    """Every given tensor lives on one CUDA device."""
    present = [t for t in tensors if t is not None]
    return all(t.is_cuda and t.device == present[0].device for t in present)


def _fast_input(x: torch.Tensor) -> bool:
    return isinstance(x, torch.Tensor) and _on_cuda(x) and x.dtype in _SUFFIX and x.numel() > 0


_sm_count = _cuda.sm_count


def _grid(work_items: int, device: torch.device, *, block: int = _THREADS) -> tuple[int]:
    """Enough blocks for ``work_items`` (one per thread), capped at 16 blocks per SM (kernels grid-stride)."""
    return (max(1, min(ceil_div(work_items, block), 16 * _sm_count(device.index or 0))),)


def _aligned(t: torch.Tensor) -> torch.Tensor:
    """``t`` contiguous with a 16-byte aligned start (a copy only when needed), for vector loads."""
    t = t.contiguous()
    return t if t.data_ptr() % 16 == 0 else t.clone()


def _run(filename: str, name: str, grid: tuple[int, ...], block: int | tuple[int, ...], args: tuple[Any, ...],
         device: torch.device) -> None:
    """Launch ``kernels/<filename>``'s ``name`` as compiled for ``device`` (the tensors' device, not necessarily
    the current one), on ``device``'s current stream."""
    launch(get_kernel(filename, name, device.index), grid, block if isinstance(block, tuple) else (block,), args,
           device=device)
