"""LayerNorm, RMSNorm, L2 normalization, forward and backward: ``kernels/norm.cu``.

Row statistics (mean, rstd, the backward's row sums) are fp32 reductions in a
different order than torch's, so outputs match the reference within the dtype's
tolerance and ``mean``/``rstd`` within fp32's; each element-wise step keeps the
reference's formula (L2 normalization's backward divides once per row).

Launch shape: ``TPR`` threads share a row (a power of two from 32 to 512: one
warp per row for narrow rows, up to a 512-thread block for wide ones) and keep
it in registers, 4 packs of 16 bytes per thread (or 8 single elements when the
width or the pointers do not allow 16-byte vectors); ``256 // TPR`` rows per
block; one wave of blocks (as many as the GPU holds at once; L2 normalization's
backward at most 512 threads per SM, like the other backward kernels) walks the rows with
a grid-stride loop, each thread prefetching its part of the block's next row into
L2 (forward vector forms: and copying it into shared memory, 16 bytes per pack and
thread of dynamic shared memory, 16 KiB for 256 threads). Backward kernels
accumulate the weight (and bias) gradients of their rows in
registers (LayerNorm's bias gradient in shared memory, for blocks of at most 256
threads, beside each element's ``g`` and ``xhat``, which the second pass reads back
instead of recomputing: 96 KiB of dynamic shared memory for fp16/bf16, 48 KiB for
fp32, which ``_cuda`` opts the kernel in to; 512-thread blocks run ``layer_norm_bwd_wide``,
which keeps the bias gradient in registers), write one fp32 partial row per row slot
(16-byte stores), and a second small kernel
sums the partial rows (``column_sums.cuh``, shaped by ``_cuda.column_sums_shape``). Rows wider than
a 512-thread block holds (16384 fp16/bf16, 8192 fp32, 4096 unaligned elements) go
to the reference, as do CPU tensors, empty tensors and mixed dtypes.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import _cuda

__all__ = ["NormKernels", "max_fast_width"]

KERNEL_FILE = "norm.cu"
_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_VECTOR_WIDTH = {torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}  # elements per 16 bytes
_MAX_ROW_THREADS = 512
_VECTOR_PACKS, _SCALAR_PACKS = 4, 8  # VEC_PPT and SCALAR_PPT in norm.cu
_THREADS = 256
#: layer_norm_bwd keeps its bias-gradient sums in shared memory sized for blocks of at most this
#: many threads (DB_THREADS in norm.cu); wider blocks run layer_norm_bwd_wide.
_DB_THREADS = 256
#: l2_norm_bwd's resident threads per SM at most (its 64 registers would fit 1024): the other backward
#: kernels' occupancy (two 256-thread blocks), so that an SM keeps two rows of x and dy, not four, in
#: flight and prefetched into L2 (at 4 x 256 threads it ran at 78% of a copy, RMSNorm's backward at 88%).
_BWD_THREADS_PER_SM = 512
#: Blocks per SM assumed when CuPy cannot answer the occupancy query (2 x 512 threads always fit).
_FALLBACK_BLOCKS_PER_SM = 2


def max_fast_width(dtype: torch.dtype, *, vectorized: bool = True) -> int:
    """The widest row the kernels hold (wider rows run on the reference)."""
    per_thread = _VECTOR_PACKS * _VECTOR_WIDTH[dtype] if vectorized else _SCALAR_PACKS
    return _MAX_ROW_THREADS * per_thread


def _wave(name: str, device_index: int, threads: int, shared: int = 0) -> int:
    """How many ``threads``-thread blocks of kernel ``name`` (with ``shared`` bytes of dynamic shared memory) the
    whole GPU holds at once."""
    kernel = _cuda.get_kernel(KERNEL_FILE, name, device_index)
    return _cuda.resident_blocks(kernel, device_index, threads, shared, fallback_per_sm=_FALLBACK_BLOCKS_PER_SM)


def _row_layout(n: int, dtype: torch.dtype, *tensors: Optional[torch.Tensor]) -> Optional[tuple[bool, int, int]]:
    """``(vec, threads_per_row, rows_per_block)`` for rows of ``n`` elements, or None if too wide."""
    vec = n % _VECTOR_WIDTH[dtype] == 0 and all(t is None or t.data_ptr() % 16 == 0 for t in tensors)
    per_thread = _VECTOR_PACKS * _VECTOR_WIDTH[dtype] if vec else _SCALAR_PACKS
    tpr = 32
    while tpr * per_thread < n:
        tpr *= 2
    if tpr > _MAX_ROW_THREADS:
        return None
    return vec, tpr, max(1, _THREADS // tpr)


def _fast(*tensors: torch.Tensor) -> bool:
    """CUDA, one supported dtype and device for all, nothing empty."""
    first = tensors[0]
    return (first.is_cuda and first.dtype in _SUFFIX and first.numel() > 0
            and all(t.dtype == first.dtype and t.device == first.device for t in tensors))


def _stats_ok(stat: torch.Tensor, rows: int, like: torch.Tensor) -> bool:
    return stat.dtype == torch.float32 and stat.device == like.device and stat.numel() == rows


def _forward(kind: str, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
             eps: float, zero_centered: bool):
    """Launch ``<kind>_fwd``; returns ``(y, mean or None, rstd)`` or None when the row is too wide."""
    n = x.shape[-1] if weight is None else weight.numel()
    rows = x.numel() // n
    x = x.contiguous()
    weight = None if weight is None else weight.contiguous()
    bias = None if bias is None else bias.contiguous()
    layout = _row_layout(n, x.dtype, x, weight, bias)
    if layout is None:
        return None
    vec, tpr, rpb = layout
    y = torch.empty_like(x)
    mean = torch.empty(rows, dtype=torch.float32, device=x.device) if kind == "layer_norm" else None
    rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
    name = f"{kind}_fwd_{_SUFFIX[x.dtype]}"
    shared = _VECTOR_PACKS * tpr * rpb * 16 if vec else 0  # the vector form's RowStage: a 16-byte slot per pack
    grid = (min(-(-rows // rpb), _wave(name, x.device.index, tpr * rpb, shared)),)
    c = _cuda
    tail = (c.i64(rows), c.i64(n), c.f32(eps))
    if kind == "layer_norm":
        args = (c.ptr(x), c.ptr(weight), c.ptr(bias), c.ptr(y), c.ptr(mean), c.ptr(rstd), *tail,
                c.i32(int(zero_centered)), c.i32(int(vec)))
    elif kind == "rms_norm":
        args = (c.ptr(x), c.ptr(weight), c.ptr(y), c.ptr(rstd), *tail, c.i32(int(zero_centered)), c.i32(int(vec)))
    else:
        args = (c.ptr(x), c.ptr(y), c.ptr(rstd), *tail, c.i32(int(vec)))
    c.launch(c.get_kernel(KERNEL_FILE, name), grid, (tpr, rpb), args, device=x.device, shared_mem=shared)
    return y, mean, rstd


def _backward(kind: str, dy: torch.Tensor, x: torch.Tensor, mean: Optional[torch.Tensor], rstd: torch.Tensor,
              weight: Optional[torch.Tensor], eps: float, zero_centered: bool):
    """Launch ``<kind>_bwd`` (+ the weight-gradient finalize); returns ``(dx, dweight, dbias)`` or None."""
    n = x.shape[-1] if weight is None else weight.numel()
    rows = x.numel() // n
    dy, x, rstd = dy.contiguous(), x.contiguous(), rstd.contiguous()
    mean = None if mean is None else mean.contiguous()
    weight = None if weight is None else weight.contiguous()
    layout = _row_layout(n, x.dtype, dy, x, weight)
    if layout is None:
        return None
    vec, tpr, rpb = layout
    dx = torch.empty_like(x)
    suffix = _SUFFIX[x.dtype]
    wide = kind == "layer_norm" and tpr * rpb > _DB_THREADS
    name = f"{kind}_bwd_wide_{suffix}" if wide else f"{kind}_bwd_{suffix}"
    shared = 0
    if kind == "layer_norm" and not wide:  # the bias gradient, g and xhat in shared memory: 3 x DB_FLOATS(V) floats
        shared = 3 * max(_VECTOR_PACKS * _VECTOR_WIDTH[x.dtype], _SCALAR_PACKS) * _DB_THREADS * 4  # a thread
    blocks = min(-(-rows // rpb), _wave(name, x.device.index, tpr * rpb, shared))
    if kind == "l2_norm":  # at most _BWD_THREADS_PER_SM resident threads per SM, as the other backward kernels
        per_sm = max(1, _BWD_THREADS_PER_SM // (tpr * rpb))
        blocks = min(blocks, per_sm * _cuda.sm_count(x.device.index))
    parts = blocks * rpb
    partial_w = torch.empty((parts, n), dtype=torch.float32, device=x.device) if weight is not None else None
    partial_b = torch.empty((parts, n), dtype=torch.float32, device=x.device) if kind == "layer_norm" else None
    c = _cuda
    if kind == "layer_norm":
        args = (c.ptr(dy), c.ptr(x), c.ptr(mean), c.ptr(rstd), c.ptr(weight), c.ptr(dx), c.ptr(partial_w),
                c.ptr(partial_b), c.i64(rows), c.i64(n), c.i32(int(zero_centered)), c.i32(int(vec)))
    elif kind == "rms_norm":
        args = (c.ptr(dy), c.ptr(x), c.ptr(rstd), c.ptr(weight), c.ptr(dx), c.ptr(partial_w), c.i64(rows),
                c.i64(n), c.i32(int(zero_centered)), c.i32(int(vec)))
    else:
        args = (c.ptr(dy), c.ptr(x), c.ptr(rstd), c.ptr(dx), c.i64(rows), c.i64(n), c.f32(eps), c.i32(int(vec)))
    c.launch(c.get_kernel(KERNEL_FILE, name), (blocks,), (tpr, rpb), args, device=x.device, shared_mem=shared)
    if weight is None:
        return dx, None, None
    dweight = torch.empty(n, dtype=weight.dtype, device=x.device)
    dbias = torch.empty(n, dtype=weight.dtype, device=x.device) if partial_b is not None else None
    grid, block, vc = c.column_sums_shape(n, x.device)
    args = (c.ptr(partial_w), c.ptr(partial_b), c.i64(parts), c.i64(n), c.ptr(dweight), c.ptr(dbias), c.i32(vc))
    c.launch(c.get_kernel(KERNEL_FILE, f"wgrad_finalize_{suffix}"), grid, block, args, device=x.device)
    return dx, dweight, dbias


class NormKernels:
    """Mixin overriding the normalization kernels of ``KernelBackend`` (see the module docstring)."""

    def layer_norm_forward(self, x, weight, bias, *, eps, zero_centered_gamma, out_dtype):
        if _fast(x, weight, bias) and out_dtype == x.dtype and x.numel() % weight.numel() == 0:
            result = _forward("layer_norm", x, weight, bias, eps, zero_centered_gamma)
            if result is not None:
                y, mean, rstd = result
                return y.reshape(x.shape), mean, rstd
        return super().layer_norm_forward(
            x, weight, bias, eps=eps, zero_centered_gamma=zero_centered_gamma, out_dtype=out_dtype
        )

    def layer_norm_backward(self, grad_output, x, mean, rstd, weight, *, zero_centered_gamma):
        if self._backward_ok(grad_output, x, weight, mean, rstd):
            result = _backward("layer_norm", grad_output, x, mean, rstd, weight, 0.0, zero_centered_gamma)
            if result is not None:
                dx, dw, db = result
                return dx.reshape(x.shape), dw.reshape(weight.shape), db.reshape(weight.shape)
        return super().layer_norm_backward(
            grad_output, x, mean, rstd, weight, zero_centered_gamma=zero_centered_gamma
        )

    def rms_norm_forward(self, x, weight, *, eps, zero_centered_gamma, out_dtype):
        if _fast(x, weight) and out_dtype == x.dtype and x.numel() % weight.numel() == 0:
            result = _forward("rms_norm", x, weight, None, eps, zero_centered_gamma)
            if result is not None:
                y, _, rstd = result
                return y.reshape(x.shape), rstd
        return super().rms_norm_forward(x, weight, eps=eps, zero_centered_gamma=zero_centered_gamma,
                                        out_dtype=out_dtype)

    def rms_norm_backward(self, grad_output, x, rstd, weight, *, zero_centered_gamma):
        if self._backward_ok(grad_output, x, weight, None, rstd):
            result = _backward("rms_norm", grad_output, x, None, rstd, weight, 0.0, zero_centered_gamma)
            if result is not None:
                dx, dw, _ = result
                return dx.reshape(x.shape), dw.reshape(weight.shape)
        return super().rms_norm_backward(grad_output, x, rstd, weight, zero_centered_gamma=zero_centered_gamma)

    def l2_normalize_forward(self, x, *, eps):
        if _fast(x) and x.dim() > 0:
            result = _forward("l2_norm", x, None, None, eps, False)
            if result is not None:
                y, _, r = result
                return y.reshape(x.shape), r
        return super().l2_normalize_forward(x, eps=eps)

    def l2_normalize_backward(self, grad_output, x, rsqrt_norm, *, eps):
        rows = x.numel() // x.shape[-1] if x.dim() > 0 and x.shape[-1] > 0 else -1
        if (_fast(grad_output, x) and grad_output.shape == x.shape and rows > 0
                and _stats_ok(rsqrt_norm, rows, x)):
            result = _backward("l2_norm", grad_output, x, None, rsqrt_norm, None, eps, False)
            if result is not None:
                return result[0].reshape(x.shape)
        return super().l2_normalize_backward(grad_output, x, rsqrt_norm, eps=eps)

    @staticmethod
    def _backward_ok(dy, x, weight, mean, rstd) -> bool:
        """Whether the fast backward applies: matching dtypes and shapes, fp32 per-row statistics."""
        if not (_fast(dy, x, weight) and dy.shape == x.shape and x.numel() % weight.numel() == 0):
            return False
        rows = x.numel() // weight.numel()
        return _stats_ok(rstd, rows, x) and (mean is None or _stats_ok(mean, rows, x))
