"""Quantize, dequantize and amax of the FP8 recipes (per-tensor, MXFP8, block): CUDA kernels, bit-identical
to the reference (NVFP4: :mod:`fastpath.quantize_nvfp4`).

The specification is ``refops.kernels.reference.quant_*``; every kernel reproduces its
sequence of fp32 (and, for per-tensor and block scales, fp64) operations op for op.

===========================  ==============================================================
method                        kernels (``fastpath/kernels/``)
===========================  ==============================================================
amax                          ``cast_fp8.cu: fp8_amax_*`` (one pass, block max + atomicMax)
compute_scale_from_amax       ``fp8_compute_scale`` (one thread per element: one launch
                              instead of a dozen torch ops on a (1,) tensor)
delayed_scaling_update        ``fp8_delayed_scaling_update`` (one block per slot: history roll,
                              amax and scale in one launch instead of ~20 torch ops)
quantize_float8               ``fp8_cast_*`` (row-wise only, flat) or ``fp8_cast_transpose_*``
                              (one 128x128 tile per block: row-wise bytes and the transposed
                              copy in one pass); the delayed-scaling amax is taken in the same
                              pass and merged into the accumulator by compare-and-swap
dequantize_float8             ``fp8_dequantize_*``
quantize_mxfp8                ``mxfp8.cu: mxfp8_quantize_*`` (32x128 tiles, both usages and
                              2D in one pass)
dequantize_mxfp8              ``mxfp8_dequantize_*``
quantize_float8_block         ``fp8_block.cu: fp8_block_quantize_*`` (one 128x128 tile per
                              block, 1D and 2D, both usages and the transpose in one pass)
dequantize_float8_block       ``fp8_block_dequantize_*``
===========================  ==============================================================

What runs the reference instead (``super()``), and why:

* CPU tensors, input dtypes other than fp32/fp16/bf16, empty tensors, 0-dim tensors in
  the per-tensor cast (the reference broadcasts them against the (1,) scale to shape
  (1,)), and calls that ask for no usage: nothing to accelerate; the reference also
  produces the exact errors and degenerate results for them.
* Invalid shapes or options: the reference raises its error.
* ``compute_scale_from_amax`` of an amax that is not fp32 (the reference converts it
  first); the block recipes compute their scales inside the quantize kernels.
* Dequantize inputs in unusual layouts the kernels do not index (scale tensors whose
  last dim is strided, data not stored as uint8/the FP8 dtype).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from refops.kernels.reference.quant_mxfp8 import check_mxfp8_shape
from refops.layouts import (
    ceil_div,
    columnwise_shape,
    float8_block_scale_shape,
    float8_block_scale_valid_shape,
    mxfp8_scale_shape,
    mxfp8_scale_valid_shape,
    rows_cols,
)

from ._cuda import f32, f64, i32, i64, ptr
from ._quantize_launch import _SUFFIX, _THREADS, _aligned, _fast_input, _grid, _on_cuda, _run, _sm_count

__all__ = ["QuantizeKernels"]

#: FP8 dtype -> (is E5M2, fmax, fl(1/fmax) bits).
_FP8 = {
    torch.float8_e4m3fn: (0, 448.0, 0x3B124925),
    torch.float8_e5m2: (1, 57344.0, 0x37924925),
}
_TILE_THREADS = 512
#: 16-byte vectors per block of the flat kernels in cast_fp8.cu (FLAT_THREADS x UNROLL x CHUNKS).
_AMAX_VECTORS = 256 * 4 * 4
_CAST_VECTORS = 256 * 4 * 2
_DEQUANT_VECTORS = 256 * 8
#: Resident 256-thread blocks per SM of the persistent mxfp8.cu tile kernels (their ``__launch_bounds__``).
#: The 128x128-tile kernels of cast_fp8.cu / fp8_block.cu are not persistent: one block per tile.
_MXFP8_BLOCKS_PER_SM = {torch.float32: 2, torch.float16: 4, torch.bfloat16: 4}


# ------------------------------------------------------------------ helpers
def _chunk_grid(vectors: int, per_block: int) -> tuple[int]:
    """One block per ``per_block`` 16-byte vectors (the flat kernels' chunks); at least one block."""
    return (max(1, ceil_div(vectors, per_block)),)


def _persistent_grid(tiles: int, device: torch.device, blocks_per_sm: int) -> tuple[int]:
    """Persistent tile kernels: at most the blocks that are resident at once (``blocks_per_sm``, which the
    kernel's ``__launch_bounds__`` guarantees, times the SMs), with the tiles spread evenly so that every
    block runs the same number of rounds (no last round with a few blocks alone)."""
    slots = blocks_per_sm * _sm_count(device.index or 0)
    return (max(1, ceil_div(tiles, ceil_div(tiles, slots))),)


def _f32_from_bits(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


def _amax_into(x: torch.Tensor, out: torch.Tensor, out2: torch.Tensor | None = None) -> None:
    """``out`` (and ``out2``), zero-initialised fp32, become ``max(itself, amax(x))``."""
    x = _aligned(x)
    n = x.numel()
    _run("cast_fp8.cu", f"fp8_amax_{_SUFFIX[x.dtype]}", _chunk_grid(n * x.element_size() // 16, _AMAX_VECTORS),
         _THREADS, (ptr(x), i64(n), i32(1), ptr(out), ptr(out2)), x.device)


class QuantizeKernels:
    """Mixin overriding the quantization kernels of ``KernelBackend`` (see the module docstring)."""

    # -------------------------------------------------------------- amax
    def amax(self, x: torch.Tensor) -> torch.Tensor:
        if not _fast_input(x):
            return super().amax(x)
        out = torch.zeros(1, dtype=torch.float32, device=x.device)
        _amax_into(x, out)
        return out

    def compute_scale_from_amax(self, amax, *, fmax, force_pow_2_scales, amax_epsilon, value_for_inf):
        if not (_on_cuda(amax) and amax.dtype == torch.float32 and amax.numel() > 0):
            return super().compute_scale_from_amax(amax, fmax=fmax, force_pow_2_scales=force_pow_2_scales,
                                                   amax_epsilon=amax_epsilon, value_for_inf=value_for_inf)
        a = amax if amax.is_contiguous() else amax.contiguous()  # the kernel reads the values only
        scale = torch.empty(a.shape, dtype=torch.float32, device=a.device)
        _run("cast_fp8.cu", "fp8_compute_scale", _grid(a.numel(), a.device), _THREADS,
             (ptr(a), i64(a.numel()), f64(fmax), f64(amax_epsilon), f64(value_for_inf), i32(int(force_pow_2_scales)),
              ptr(scale)), a.device)
        return scale

    def delayed_scaling_update(self, amax_history, scale, amax, *, numerator, algorithm):
        fits = (
            algorithm in ("max", "most_recent") and _on_cuda(amax_history, scale, amax)
            and all(t.dtype == torch.float32 and t.is_contiguous() for t in (amax_history, scale, amax))
            and amax_history.dim() == 2 and scale.shape == amax.shape == amax_history.shape[1:]
        )
        if not fits:
            return super().delayed_scaling_update(amax_history, scale, amax, numerator=numerator, algorithm=algorithm)
        length, n = amax_history.shape
        if n == 0:
            return None
        one_block_per_slot = _grid(n, amax_history.device, block=1)
        _run("cast_fp8.cu", "fp8_delayed_scaling_update", one_block_per_slot, _THREADS,
             (ptr(amax_history), ptr(scale), ptr(amax), i64(length), i64(n), i32(int(algorithm == "max")),
              f64(numerator)), amax_history.device)
        return None

    # ------------------------------------------------------ per-tensor FP8
    def quantize_float8(self, x, scale, *, fp8_dtype, rowwise, columnwise, amax_accumulator=None):
        accumulator_ok = amax_accumulator is None or (
            _on_cuda(x, amax_accumulator) and amax_accumulator.dtype == torch.float32
            and amax_accumulator.numel() == 1 and amax_accumulator.dim() > 0  # the reference rejects a 0-dim one
        )
        if not (_fast_input(x) and x.dim() > 0 and fp8_dtype in _FP8 and (rowwise or columnwise)
                and _on_cuda(x, scale) and scale.numel() == 1 and accumulator_ok):
            return super().quantize_float8(x, scale, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                                           amax_accumulator=amax_accumulator)
        e5m2 = _FP8[fp8_dtype][0]
        m, k = rows_cols(x.shape)
        xc = _aligned(x)
        # The kernels read one fp32 value through a pointer (a (1,) fp32 scale, the common case, as it is).
        s = scale if scale.dtype == torch.float32 else scale.to(torch.float32)
        scale_inv = torch.empty(1, dtype=torch.float32, device=x.device)
        row = torch.empty(x.shape, dtype=torch.uint8, device=x.device) if rowwise else None
        col = None
        sfx = _SUFFIX[x.dtype]
        # The kernels update the accumulator themselves (fmaxf by compare-and-swap, one per block).
        if columnwise:
            col = torch.empty(columnwise_shape(x.shape), dtype=torch.uint8, device=x.device)
            tiles = ceil_div(m, 128) * ceil_div(k, 128)
            vec_in, vec_row, vec_col = int(k % 8 == 0), int(k % 8 == 0), int(m % 16 == 0)
            _run("cast_fp8.cu", f"fp8_cast_transpose_{sfx}",
                 (tiles,), _TILE_THREADS,
                 (ptr(xc), i32(m), i32(k), i32(vec_in), i32(vec_row), i32(vec_col), ptr(s), i32(e5m2), ptr(row),
                  ptr(col), ptr(scale_inv), ptr(amax_accumulator)), x.device)
        else:
            n = xc.numel()
            _run("cast_fp8.cu", f"fp8_cast_{sfx}", _chunk_grid(n * xc.element_size() // 16, _CAST_VECTORS),
                 _THREADS, (ptr(xc), i64(n), i32(1), ptr(s), i32(e5m2), ptr(row), ptr(scale_inv),
                            ptr(amax_accumulator)), x.device)
        return row, scale_inv, col, scale_inv

    def dequantize_float8(self, data, scale_inv, *, fp8_dtype, out_dtype):
        if not (_on_cuda(data, scale_inv) and fp8_dtype in _FP8 and out_dtype in _SUFFIX and data.dim() > 0
                and data.dtype in (torch.uint8, fp8_dtype) and scale_inv.numel() == 1 and data.numel() > 0):
            return super().dequantize_float8(data, scale_inv, fp8_dtype=fp8_dtype, out_dtype=out_dtype)
        q = _aligned(data.view(torch.uint8))
        si = scale_inv.reshape(1).to(torch.float32).contiguous()
        out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
        n = q.numel()
        vectors = n // (16 // out.element_size())  # one 16-byte store of out per vector
        _run("cast_fp8.cu", f"fp8_dequantize_{_SUFFIX[out_dtype]}", _chunk_grid(vectors, _DEQUANT_VECTORS), _THREADS,
             (ptr(q), i64(n), i32(1), ptr(si), i32(_FP8[fp8_dtype][0]), ptr(out)), data.device)
        return out

    # --------------------------------------------------------------- MXFP8
    def quantize_mxfp8(self, x, *, fp8_dtype, rowwise, columnwise, with_2d_quantization=False):
        if not (_fast_input(x) and fp8_dtype in _FP8 and (rowwise or columnwise) and _mxfp8_shape_ok(x.shape)):
            return super().quantize_mxfp8(x, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                                          with_2d_quantization=with_2d_quantization)
        e5m2, _, inv_fmax_bits = _FP8[fp8_dtype]
        m, k = rows_cols(x.shape)
        xc = _aligned(x)
        dev = x.device
        u8 = dict(dtype=torch.uint8, device=dev)
        row_data = torch.empty(x.shape, **u8) if rowwise else None
        row_scale = _scales(mxfp8_scale_shape(x.shape), mxfp8_scale_valid_shape(x.shape), **u8) if rowwise else None
        col_data = torch.empty(x.shape, **u8) if columnwise else None
        col_scale = (_scales(mxfp8_scale_shape(x.shape, columnwise=True),
                             mxfp8_scale_valid_shape(x.shape, columnwise=True), **u8) if columnwise else None)
        mode = "2d" if with_2d_quantization else "both" if rowwise and columnwise else "rows" if rowwise else "cols"
        tiles = (m // 32) * ceil_div(k, 256)
        _run("mxfp8.cu", f"mxfp8_quantize_{mode}_{_SUFFIX[x.dtype]}",
             _persistent_grid(tiles, dev, _MXFP8_BLOCKS_PER_SM[x.dtype]), _THREADS,
             (ptr(xc), i32(m), i32(k), i32(e5m2), f32(_f32_from_bits(inv_fmax_bits)),
              ptr(row_data), ptr(row_scale), i32(row_scale.shape[1] if rowwise else 0), ptr(col_data), ptr(col_scale),
              i32(col_scale.shape[1] if columnwise else 0)), dev)
        return row_data, row_scale, col_data, col_scale

    def dequantize_mxfp8(self, data, scale_inv, *, fp8_dtype, columnwise, out_dtype):
        m, k = rows_cols(data.shape)
        needed = mxfp8_scale_valid_shape(data.shape, columnwise=columnwise)
        ok = (_on_cuda(data, scale_inv) and fp8_dtype in _FP8 and out_dtype in _SUFFIX and data.numel() > 0
              and data.dtype in (torch.uint8, fp8_dtype) and scale_inv.dtype == torch.uint8 and scale_inv.dim() == 2
              and scale_inv.stride(1) == 1 and k % 32 == 0 and (not columnwise or m % 32 == 0)
              and scale_inv.shape[0] >= needed[0] and scale_inv.shape[1] >= needed[1]
              and max(m, k, scale_inv.stride(0)) < 2**31)  # the kernel indexes with 32-bit rows and columns
        if not ok:
            return super().dequantize_mxfp8(data, scale_inv, fp8_dtype=fp8_dtype, columnwise=columnwise,
                                            out_dtype=out_dtype)
        q = _aligned(data.view(torch.uint8))
        out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
        width = 16 // out.element_size()  # fp8 bytes per load, one 16-byte store
        grid, block = _row_vector_blocks(m, k // width)
        ld = scale_inv.stride(0)
        scale_vec = int(columnwise and scale_inv.data_ptr() % width == 0 and ld % width == 0)
        _run("mxfp8.cu", f"mxfp8_dequantize_{_SUFFIX[out_dtype]}", grid, block,
             (ptr(q), i32(m), i32(k), ptr(scale_inv), i32(ld), i32(int(columnwise)), i32(scale_vec),
              i32(_FP8[fp8_dtype][0]), ptr(out)), data.device)
        return out

    # --------------------------------------------------------- FP8 blocks
    def quantize_float8_block(self, x, *, fp8_dtype, rowwise, columnwise, block_scaling_dim, force_pow_2_scales,
                              amax_epsilon):
        if not (_fast_input(x) and fp8_dtype in _FP8 and block_scaling_dim in (1, 2) and (rowwise or columnwise)):
            return super().quantize_float8_block(
                x, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise, block_scaling_dim=block_scaling_dim,
                force_pow_2_scales=force_pow_2_scales, amax_epsilon=amax_epsilon)
        e5m2, fmax, _ = _FP8[fp8_dtype]
        m, k = rows_cols(x.shape)
        dev = x.device
        xc = _aligned(x)
        two_d = block_scaling_dim == 2
        bm, bk = ceil_div(m, 128), ceil_div(k, 128)
        layout = dict(block_scaling_dim=block_scaling_dim)
        row_scale_shape = float8_block_scale_shape(x.shape, **layout)
        col_scale_shape = float8_block_scale_shape(x.shape, columnwise=True, **layout)
        row_valid = float8_block_scale_valid_shape(x.shape, **layout)
        col_valid = float8_block_scale_valid_shape(x.shape, columnwise=True, **layout)
        f32_on_dev = dict(dtype=torch.float32, device=dev)
        row_data = torch.empty(x.shape, dtype=torch.uint8, device=dev) if rowwise else None
        row_scale = _scales(row_scale_shape, row_valid, **f32_on_dev) if rowwise else None
        col_data = torch.empty((k, *x.shape[:-1]), dtype=torch.uint8, device=dev) if columnwise else None
        col_scale = _scales(col_scale_shape, col_valid, **f32_on_dev) if columnwise else None
        value_for_inf = float(torch.finfo(x.dtype).max)
        mode = "2d" if two_d else "both" if rowwise and columnwise else "rows" if rowwise else "cols"
        _run("fp8_block.cu", f"fp8_block_quantize_{mode}_{_SUFFIX[x.dtype]}",
             (bm * bk,), _TILE_THREADS,
             (ptr(xc), i32(m), i32(k), i32(int(k % 8 == 0)), i32(int(k % 8 == 0)), i32(int(m % 16 == 0)), i32(e5m2),
              f32(fmax), i32(int(force_pow_2_scales)), f32(amax_epsilon), f32(value_for_inf),
              ptr(row_data), ptr(row_scale), i32(row_scale_shape[1]), ptr(col_data), ptr(col_scale),
              i32(col_scale_shape[1])), dev)
        return row_data, row_scale, col_data, col_scale

    def dequantize_float8_block(self, data, scale_inv, *, fp8_dtype, columnwise, block_scaling_dim, out_dtype):
        ok = (_on_cuda(data, scale_inv) and fp8_dtype in _FP8 and out_dtype in _SUFFIX and data.numel() > 0
              and data.dim() > 0 and data.dtype in (torch.uint8, fp8_dtype) and block_scaling_dim in (1, 2)
              and scale_inv.dtype == torch.float32 and scale_inv.dim() == 2 and scale_inv.stride(1) == 1)
        if ok:
            r = data.shape[0] if columnwise else data.numel() // data.shape[-1]
            c = data.numel() // r
            needed = float8_block_scale_valid_shape((r, c), block_scaling_dim=block_scaling_dim)  # data's own 2-D view
            ok = (scale_inv.shape[0] >= needed[0] and scale_inv.shape[1] >= needed[1]
                  and max(r, c, scale_inv.stride(0)) < 2**31)  # the kernel indexes with 32-bit rows and columns
        if not ok:
            return super().dequantize_float8_block(data, scale_inv, fp8_dtype=fp8_dtype, columnwise=columnwise,
                                                   block_scaling_dim=block_scaling_dim, out_dtype=out_dtype)
        q = _aligned(data.view(torch.uint8))
        out = torch.empty(data.shape, dtype=out_dtype, device=data.device)
        width = 16 // out.element_size()  # fp8 bytes per load, one 16-byte store
        vec = c % width == 0
        grid, block = _row_vector_blocks(r, c // width if vec else c)
        _run("fp8_block.cu", f"fp8_block_dequantize_{'' if vec else 'scalar_'}{_SUFFIX[out_dtype]}", grid, block,
             (ptr(q), i32(r), i32(c), ptr(scale_inv), i32(scale_inv.stride(0)), i32(int(block_scaling_dim == 2)),
              i32(_FP8[fp8_dtype][0]), ptr(out)), data.device)
        return out

# ------------------------------------------------------------------ family helpers
def _scales(shape: tuple[int, int], valid: tuple[int, int], **kwargs: Any) -> torch.Tensor:
    """A scale tensor of ``shape`` the kernel fills over ``valid``: zero-filled only when it has padding (the
    kernel writes every valid element, so without padding ``torch.empty`` spares a fill kernel)."""
    alloc = torch.empty if tuple(shape) == tuple(valid) else torch.zeros
    return alloc(*shape, **kwargs)


def _row_vector_blocks(rows: int, vectors: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """``(grid, block)`` of the row-vector dequantize kernels: 256 threads as (tx, ty), tx covering the
    ``vectors`` 16-byte vectors of a row (a power of two up to 256), each thread 4 rows of a row block
    (``DEQ_ROWS``); row blocks past 65535 are walked by a grid-stride loop."""
    tx = min(256, 1 << max(0, (vectors - 1).bit_length()))
    ty = 256 // tx
    row_blocks = ceil_div(rows, ty * 4)
    return (ceil_div(vectors, tx), max(1, min(row_blocks, 65535))), (tx, ty)


def _mxfp8_shape_ok(shape: torch.Size) -> bool:
    try:
        check_mxfp8_shape(shape)
    except ValueError:
        return False
    return True
