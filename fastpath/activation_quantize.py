"""Fused activation + quantize (``refops.kernels.fused_activation_interface``): ``kernels/activation_quantize.cu``.

===========================================  =====================================================================
method                                        kernel (one launch, plus the bias grad's column-sum finalize)
===========================================  =====================================================================
activation_cast_float8                        ``act_cast_t_fwd_<act>_<dtype>``: act, amax into the delayed-scaling
                                              accumulator, one rounding to FP8, row-wise bytes and/or the
                                              transposed copy, per 128x128 tile
activation_backward_cast_float8               ``act_cast_t_bwd_<act>_<dtype>``: the same for ``dy * act'(x)``
activation_backward_dbias_cast_float8         ``act_cast_t_bwd_*`` with per-tile column sums of the unrounded
                                              values, then activation.cu's ``dbias_finalize_*``
activation_amax                               ``act_amax_fwd_<act>_<dtype>``: ``RN_dtype(act(x))`` and the amax of
                                              the unrounded values (current scaling's cast is then the ordinary
                                              ``quantize_float8``)
activation_backward_amax                      ``act_amax_bwd_<act>_<dtype>``
activation_backward_dbias_amax                ``act_amax_bwd_*`` with per-block column sums of the rounded values,
                                              then ``dbias_finalize_*``
===========================================  =====================================================================

Every byte, scale and amax is bit-identical to the reference's composition on the same GPU: the values come from
activation.cu's own device functions (``activation_functions.cuh``) compiled with activation.cu's options
(``ACTIVATION_COMPILE_OPTIONS``), and the casts are cast_fp8.cu's. The bias grads are fp32 sums in another order
than torch's and match within fp32 summation error, like ``dbias``.

Handled here: the unary activations (``UNARY_ACTIVATIONS``) on non-empty CUDA tensors of fp32/fp16/bf16 with
``grad_output`` of ``x``'s dtype, shape and device; the amax pass rounds to ``x``'s own dtype. Everything else
(gated activations, CPU tensors, other dtypes) runs the reference's composition (``super()``), itself of fast-path
kernels where they exist.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch

from refops.layouts import ceil_div, columnwise_shape, rows_cols

from . import _compile, _cuda
from ._cuda import i32, i64, ptr
from ._quantize_launch import _aligned as _aligned_copy
from .elementwise import (ACTIVATION_COMPILE_OPTIONS, UNARY_ACTIVATIONS, _FALLBACK_BLOCKS_PER_SM, _VECTOR_WIDTH,
                          _aligned, _blocks, _finalize_columns, _flat_shape)
from .quantize import _FP8, _TILE_THREADS

__all__ = ["ActivationQuantizeKernels", "FUSED_GROUPS", "KERNEL_FILE"]

KERNEL_FILE = "activation_quantize.cu"
#: ``#define FUSED_GROUP k`` compiles only activation ``k``'s kernels of activation_quantize.cu (0: all).
FUSED_GROUPS = {name: k for k, name in enumerate(UNARY_ACTIVATIONS, start=1)}
_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_TILE = 128


@functools.lru_cache(maxsize=None)
def _module(activation: str, device_index: int) -> Any:
    """activation_quantize.cu with only ``activation``'s kernels, compiled as activation.cu is (the values must be
    the activation kernels' bits: FMA contraction as in torch's build, subnormals kept)."""
    header = f"#define FUSED_GROUP {FUSED_GROUPS[activation]}\n"
    return _compile.compile_module(header + _cuda.kernel_source(KERNEL_FILE), ACTIVATION_COMPILE_OPTIONS,
                                   device_index, filename=KERNEL_FILE)


@functools.lru_cache(maxsize=None)
def _kernel(activation: str, name: str, device_index: int) -> Any:
    return _module(activation, device_index).get_function(name)


# ----------------------------------------------------------------- eligibility
def _inputs_fit(dy: Optional[torch.Tensor], x: torch.Tensor, activation: str) -> bool:
    if not (isinstance(x, torch.Tensor) and x.is_cuda and x.dtype in _SUFFIX and x.dim() > 0 and x.numel() > 0
            and activation in FUSED_GROUPS):
        return False
    return dy is None or (isinstance(dy, torch.Tensor) and dy.device == x.device and dy.dtype == x.dtype
                          and dy.shape == x.shape)


def _cast_fits(dy: Optional[torch.Tensor], x: torch.Tensor, activation: str, scale: torch.Tensor,
               fp8_dtype: torch.dtype, rowwise: bool, columnwise: bool,
               accumulator: Optional[torch.Tensor]) -> bool:
    if not (_inputs_fit(dy, x, activation) and fp8_dtype in _FP8 and (rowwise or columnwise)):
        return False
    m, k = rows_cols(x.shape)
    accumulator_ok = accumulator is None or (  # as quantize_float8's: the reference rejects a 0-dim one
        accumulator.is_cuda and accumulator.device == x.device and accumulator.dtype == torch.float32
        and accumulator.numel() == 1 and accumulator.dim() > 0)
    return (isinstance(scale, torch.Tensor) and scale.device == x.device and scale.numel() == 1 and accumulator_ok
            and max(m, k) < 2**31)  # the tile kernels index rows and columns with 32 bits


# -------------------------------------------------------------------- launches
def _cast_pass(dy: Optional[torch.Tensor], x: torch.Tensor, activation: str, scale: torch.Tensor,
               fp8_dtype: torch.dtype, rowwise: bool, columnwise: bool, accumulator: Optional[torch.Tensor],
               want_partial: bool) -> tuple[Any, ...]:
    """``(rowwise data, scale_inv, columnwise data, partial column sums or None)`` of the tile kernel."""
    m, k = rows_cols(x.shape)
    dev = x.device
    xc = _aligned_copy(x)
    s = scale if scale.dtype == torch.float32 else scale.to(torch.float32)
    scale_inv = torch.empty(1, dtype=torch.float32, device=dev)
    row = torch.empty(x.shape, dtype=torch.uint8, device=dev) if rowwise else None
    col = torch.empty(columnwise_shape(x.shape), dtype=torch.uint8, device=dev) if columnwise else None
    partial = torch.empty((ceil_div(m, _TILE), k), dtype=torch.float32, device=dev) if want_partial else None
    tiles = ceil_div(m, _TILE) * ceil_div(k, _TILE)
    # 16-byte row loads and 8-byte row stores need K % 8 == 0, 16-byte transposed stores M % 16 == 0.
    shape_args = (i32(m), i32(k), i32(int(k % 8 == 0)), i32(int(k % 8 == 0)), i32(int(m % 16 == 0)))
    cast_args = (ptr(s), i32(_FP8[fp8_dtype][0]), ptr(row), ptr(col), ptr(scale_inv), ptr(accumulator))
    sfx = _SUFFIX[x.dtype]
    if dy is None:
        name, args = f"act_cast_t_fwd_{activation}_{sfx}", (ptr(xc), *shape_args, *cast_args)
    else:
        name = f"act_cast_t_bwd_{activation}_{sfx}"
        args = (ptr(_aligned_copy(dy)), ptr(xc), *shape_args, *cast_args, ptr(partial))
    _cuda.launch(_kernel(activation, name, dev.index), (tiles,), (_TILE_THREADS,), args, device=dev)
    return row, scale_inv, col, partial


def _amax_pass(dy: Optional[torch.Tensor], x: torch.Tensor, activation: str,
               want_partial: bool) -> tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(RN_dtype(v), amax(v), partial column sums of the rounded values or None)`` of the row-vector kernel."""
    x = x.contiguous()
    dy = None if dy is None else dy.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    amax = torch.zeros(1, dtype=torch.float32, device=x.device)  # atomicMax on its bits: starts at +0
    vw = _VECTOR_WIDTH[x.dtype]
    n = x.shape[-1]
    rows = x.numel() // n
    if want_partial:  # column sums need the real columns
        vec = n % vw == 0 and _aligned(x, dy, out)
    else:  # element-wise only: any flat view, vectorized whenever numel allows
        vec = x.numel() % vw == 0 and _aligned(x, dy, out)
        rows, n = _flat_shape(x.numel(), vw, vec)
    v = vw if vec else 1
    name = f"act_amax_{'fwd' if dy is None else 'bwd'}_{activation}_{_SUFFIX[x.dtype]}"
    kernel = _kernel(activation, name, x.device.index)
    partial, shared = None, 0
    if want_partial:  # one partial row per row block, one wave of blocks (as activation.cu's dbias)
        _, block = _blocks(rows, n, v, x.device)
        shared = block[0] * block[1] * v * 4 if block[1] > 1 else 0
        wave = _cuda.resident_blocks(kernel, x.device.index, block[0] * block[1], shared,
                                     fallback_per_sm=_FALLBACK_BLOCKS_PER_SM)
        grid, block = _blocks(rows, n, v, x.device, wave=wave)
        partial = torch.empty((grid[1], n), dtype=torch.float32, device=x.device)
    else:
        grid, block = _blocks(rows, n, v, x.device)
    tail = (i64(rows), i64(n), i32(int(vec)))
    if dy is None:
        args = (ptr(x), ptr(out), ptr(amax), *tail)
    else:
        args = (ptr(dy), ptr(x), ptr(out), ptr(amax), ptr(partial), *tail)
    _cuda.launch(kernel, grid, block, args, device=x.device, shared_mem=shared)
    return out, amax, partial


# ---------------------------------------------------------------------- mixin
class ActivationQuantizeKernels:
    """The fused activation + quantize methods of :class:`fastpath.backend.FastpathKernels`."""

    def activation_cast_float8(self, x, activation, *, scale, fp8_dtype, rowwise, columnwise, amax_accumulator=None,
                               **params):
        if not _cast_fits(None, x, activation, scale, fp8_dtype, rowwise, columnwise, amax_accumulator):
            return super().activation_cast_float8(x, activation, scale=scale, fp8_dtype=fp8_dtype, rowwise=rowwise,
                                                  columnwise=columnwise, amax_accumulator=amax_accumulator, **params)
        row, scale_inv, col, _ = _cast_pass(None, x, activation, scale, fp8_dtype, rowwise, columnwise,
                                            amax_accumulator, want_partial=False)
        return row, scale_inv, col, scale_inv

    def activation_backward_cast_float8(self, grad_output, x, activation, *, scale, fp8_dtype, rowwise, columnwise,
                                        amax_accumulator=None, **params):
        if not _cast_fits(grad_output, x, activation, scale, fp8_dtype, rowwise, columnwise, amax_accumulator):
            return super().activation_backward_cast_float8(
                grad_output, x, activation, scale=scale, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                amax_accumulator=amax_accumulator, **params)
        row, scale_inv, col, _ = _cast_pass(grad_output, x, activation, scale, fp8_dtype, rowwise, columnwise,
                                            amax_accumulator, want_partial=False)
        return row, scale_inv, col, scale_inv

    def activation_backward_dbias_cast_float8(self, grad_output, x, activation, *, scale, fp8_dtype, rowwise,
                                              columnwise, out_dtype, amax_accumulator=None, **params):
        if not (out_dtype in _SUFFIX and _cast_fits(grad_output, x, activation, scale, fp8_dtype, rowwise,
                                                    columnwise, amax_accumulator)):
            return super().activation_backward_dbias_cast_float8(
                grad_output, x, activation, scale=scale, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise,
                out_dtype=out_dtype, amax_accumulator=amax_accumulator, **params)
        row, scale_inv, col, partial = _cast_pass(grad_output, x, activation, scale, fp8_dtype, rowwise, columnwise,
                                                  amax_accumulator, want_partial=True)
        return row, scale_inv, col, scale_inv, _finalize_columns(partial, out_dtype)

    def activation_amax(self, x, activation, *, out_dtype, **params):
        if not (_inputs_fit(None, x, activation) and out_dtype == x.dtype):
            return super().activation_amax(x, activation, out_dtype=out_dtype, **params)
        y, amax, _ = _amax_pass(None, x, activation, want_partial=False)
        return y, amax

    def activation_backward_amax(self, grad_output, x, activation, *, out_dtype, **params):
        if not (_inputs_fit(grad_output, x, activation) and out_dtype == x.dtype):
            return super().activation_backward_amax(grad_output, x, activation, out_dtype=out_dtype, **params)
        dx, amax, _ = _amax_pass(grad_output, x, activation, want_partial=False)
        return dx, amax

    def activation_backward_dbias_amax(self, grad_output, x, activation, *, out_dtype, **params):
        if not (_inputs_fit(grad_output, x, activation) and out_dtype == x.dtype):
            return super().activation_backward_dbias_amax(grad_output, x, activation, out_dtype=out_dtype, **params)
        dx, amax, partial = _amax_pass(grad_output, x, activation, want_partial=True)
        return dx, amax, _finalize_columns(partial, out_dtype)
