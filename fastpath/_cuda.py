"""Compiling CUDA sources once and launching them on torch's current stream.

Sources live in ``fastpath/kernels/*.cu``, one file per family, with
``extern "C"`` kernels. They are compiled with NVRTC (:mod:`fastpath._compile`),
without fast math, without flushing subnormals and without FMA contraction
(``--fmad=false``): the reference's arithmetic order is part of the specification. Tensors are passed as raw pointers (wrapping
a tensor as a CuPy array costs tens of microseconds), scalars as NumPy scalars.
"""

from __future__ import annotations

import functools
import os
import pathlib
import re
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ._compile import compile_module

__all__ = ["KERNEL_DIR", "COMPILE_OPTIONS", "get_kernel", "launch", "ptr", "i32", "i64", "f32", "grid_1d"]

KERNEL_DIR = pathlib.Path(__file__).resolve().parent / "kernels"
#: NVRTC options: C++17, no FMA contraction (results must match the reference's op order), no fast math.
COMPILE_OPTIONS = ("-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")
#: ``FASTPATH_LINEINFO=1`` adds source line information for profilers (Nsight Compute's source view); the code
#: generated is the same.
_PROFILE_OPTIONS = ("-lineinfo",) if os.environ.get("FASTPATH_LINEINFO") == "1" else ()


_LOCAL_INCLUDE = re.compile(r'^#include "([A-Za-z0-9_]+\.cuh)"[ \t]*$', re.MULTILINE)


def kernel_source(filename: str) -> str:
    """``kernels/<filename>`` with its ``#include "x.cuh"`` lines replaced by those files' text.

    NVRTC then compiles one self-contained source (no include path to pass), and the
    compile cache, keyed by the source, changes whenever a shared header does.
    """

    def inline(match: re.Match) -> str:
        header = (KERNEL_DIR / match.group(1)).read_text()
        return "\n".join(line for line in header.splitlines() if line.strip() != "#pragma once")

    return _LOCAL_INCLUDE.sub(inline, (KERNEL_DIR / filename).read_text())


@functools.lru_cache(maxsize=None)
def _module(filename: str, device_index: int) -> Any:
    return compile_module(kernel_source(filename), COMPILE_OPTIONS + _PROFILE_OPTIONS, device_index, filename=filename)


def get_kernel(filename: str, name: str, device_index: Optional[int] = None) -> Any:
    """The ``extern "C"`` kernel ``name`` of ``kernels/<filename>``, compiled once per process and device."""
    if device_index is None:
        device_index = torch.cuda.current_device()
    return _kernel(filename, name, device_index)


@functools.lru_cache(maxsize=None)
def _kernel(filename: str, name: str, device_index: int) -> Any:
    return _module(filename, device_index).get_function(name)


class _RawStream:
    """What CuPy's ``Function.__call__`` reads of a stream: its handle, as ``ptr``."""

    __slots__ = ("ptr",)

    def __init__(self, handle: int) -> None:
        self.ptr = handle


@functools.lru_cache(maxsize=64)
def _stream(handle: int) -> _RawStream:
    return _RawStream(handle)


#: torch's C entry points for the current device and the current stream's raw handle: a kernel launch
#: is a few microseconds, and the public torch.cuda.current_stream() alone costs more than that.
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda index: torch.cuda.current_stream(index).cuda_stream)


#: The dynamic shared memory (bytes) each loaded kernel has opted in to, by (kernel, device index).
_dynamic_shared_allowed: dict[tuple[Any, int], int] = {}


def allow_dynamic_shared(kernel: Any, device_index: int, nbytes: int) -> None:
    """Let ``kernel`` take ``nbytes`` of dynamic shared memory, before its occupancy is queried or it is launched.

    A kernel's static and dynamic shared memory together may pass 48 KiB only after it opts in
    (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES): LayerNorm backward's fp32 form takes 48 KiB of dynamic shared
    memory beside its static reduction buffer, so every kernel that takes any dynamic shared memory opts in, to the
    largest size asked of it so far (never lowered). Remembered per loaded kernel object, so a kernel compiled and
    loaded again opts in again."""
    key = (kernel, device_index)
    if nbytes <= _dynamic_shared_allowed.get(key, 0):
        return
    import cupy
    from cupy.cuda import driver

    with cupy.cuda.Device(device_index):
        driver.funcSetAttribute(kernel.ptr, 8, nbytes)  # 8: CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _dynamic_shared_allowed[key] = nbytes


def launch(kernel: Any, grid: Sequence[int], block: Sequence[int], args: Sequence[Any], *,
           device: torch.device, shared_mem: int = 0) -> None:
    """Launch ``kernel`` on torch's current stream of ``device``.

    The kernel's module was loaded in ``device``'s primary context, so the launch needs that
    device to be current: it usually is (torch's current device), else it is made current for
    the launch.
    """
    index = device.index if device.index is not None else _current_device()
    if shared_mem:
        allow_dynamic_shared(kernel, index, shared_mem)
    stream = _stream(_raw_stream(index))
    if _current_device() == index:
        kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=stream)
    else:
        import cupy

        with cupy.cuda.Device(index):
            kernel(tuple(grid), tuple(block), tuple(args), shared_mem=shared_mem, stream=stream)


def ptr(tensor: torch.Tensor | None) -> np.uint64:
    """A tensor's device pointer as a kernel argument (0 for None)."""
    return np.uint64(0 if tensor is None else tensor.data_ptr())


def i32(value: int) -> np.int32:
    return np.int32(value)


def i64(value: int) -> np.int64:
    return np.int64(value)


def f32(value: float) -> np.float32:
    return np.float32(value)


def f64(value: float) -> np.float64:
    return np.float64(value)


def grid_1d(n: int, block: int, *, max_blocks: int = 65535 * 8) -> tuple[int]:
    """Enough blocks of ``block`` threads for ``n`` items (kernels grid-stride past the cap)."""
    return (max(1, min((n + block - 1) // block, max_blocks)),)


#: Threads a row-stripe of the column-sum kernels (COLUMN_SUM_STRIPES in kernels/column_sums.cuh).
COLUMN_SUM_STRIPES = 16


@functools.lru_cache(maxsize=8)
def sm_count(device_index: int) -> int:
    """The number of SMs of CUDA device ``device_index``."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.lru_cache(maxsize=None)
def resident_blocks(kernel: Any, device_index: int, threads: int, shared: int = 0, *, fallback_per_sm: int) -> int:
    """How many ``threads``-thread blocks of ``kernel``, with ``shared`` bytes of dynamic shared memory each, the
    whole GPU holds at once: one wave, the grid of a grid-stride kernel whose blocks all do the same work (a grid
    of more blocks than that runs a last, partial wave). ``fallback_per_sm`` blocks per SM where CuPy lacks the
    occupancy query. A kernel with dynamic shared memory opts in first (``allow_dynamic_shared``), as its launch
    will. Cached per loaded kernel and shape: launchers call it on every launch."""
    if shared:
        allow_dynamic_shared(kernel, device_index, shared)
    per_sm = fallback_per_sm
    try:
        import cupy
        from cupy.cuda import driver

        with cupy.cuda.Device(device_index):
            per_sm = int(driver.occupancyMaxActiveBlocksPerMultiprocessor(kernel.ptr, threads, shared))
    except Exception:  # an older CuPy without the query: the caller's estimate
        pass
    return max(1, per_sm) * sm_count(device_index)


def column_sums_shape(width: int, device: torch.device) -> tuple[tuple[int], tuple[int, int], int]:
    """``(grid, block, vc)`` of a column-sum kernel (``column_sums.cuh``) over rows of ``width`` fp32 values:
    ``vc`` columns per thread, 4 where the width allows it and the blocks still cover every SM, else 2 where it
    allows that, else 1."""
    index = device.index if device.index is not None else _current_device()
    if width % 4 == 0 and -(-width // 128) >= sm_count(index):
        vc = 4
    else:
        vc = 2 if width % 2 == 0 else 1
    return (-(-width // (32 * vc)),), (32, COLUMN_SUM_STRIPES), vc
