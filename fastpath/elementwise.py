"""Activations, bias + activation, activation backward (+ dbias), dbias: ``kernels/activation.cu``.

Element-wise results are bit-identical to the reference backend on the same
GPU: each kernel repeats the reference's fp32 op sequence (see the ``.cu`` file)
and rounds once to the storage dtype. The module is compiled as torch's kernels
are: FMA contraction on, subnormals kept (``ACTIVATION_COMPILE_OPTIONS``; see
:func:`fastpath._compile.compile_module` for why that needs NVRTC directly
rather than ``cupy.RawModule``).
``dbias`` is a column sum in a different order than torch's, so it matches
within tolerance.

Handled here: CUDA tensors of fp32/fp16/bf16 with matching dtypes (``bias`` and
``grad_output`` in ``x``'s dtype), every activation of
``refops.kernels.reference.activations``. Everything else (CPU tensors, empty
tensors, mixed dtypes, unknown activations, missing parameters, odd gated
widths) goes to the reference, which also raises the reference's errors.

Launch shape: a thread owns one 16-byte column vector (8 fp16/bf16 or 4 fp32
values) of a row, or one element when the width or the pointers do not allow
vectors; 256 threads per block arranged ``(tx, ty)`` over (column vectors,
rows); blocks walk rows with a grid-stride loop. A unary activation without a
bias is one flat array, so any tensor shape vectorizes. The bf16 SiTU-GLU
forward without a bias, on 16-byte vectors (from ``_SITU_TABLE_MIN_OUTPUTS`` outputs), runs
``act_fwd_situglu_table_bf16`` instead: 1024-thread blocks, one wave, each
block filling shared-memory tables of the activation's two factors first.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

import torch

from . import _compile, _cuda

__all__ = [
    "ElementwiseKernels",
    "ACTIVATION_COMPILE_OPTIONS",
    "UNARY_ACTIVATIONS",
    "GATED_ACTIVATIONS",
    "ACTIVATION_GROUPS",
    "FP32_CONSTANTS",
]

KERNEL_FILE = "activation.cu"
UNARY_ACTIVATIONS = ("identity", "gelu", "qgelu", "relu", "srelu", "silu", "sigmoid")
GATED_ACTIVATIONS = ("glu", "geglu", "qgeglu", "reglu", "sreglu", "swiglu", "clamped_swiglu", "situglu")
#: ``#define ACTIVATION_GROUP k`` compiles only group ``k`` of activation.cu (0: all).
ACTIVATION_GROUPS = {name: k for k, name in enumerate(UNARY_ACTIVATIONS + GATED_ACTIVATIONS + ("dbias",), start=1)}
#: The fp32 constants activation.cu hard-codes, as fp32 values of the reference's Python constants.
FP32_CONSTANTS = {
    "SQRT_2_OVER_PI": float.fromhex("0x1.988454p-1"),
    "GELU_CUBIC": float.fromhex("0x1.6e4e26p-5"),
    "GELU_CUBIC_X3": float.fromhex("0x1.12ba9ep-3"),
    "QGELU_ALPHA": float.fromhex("0x1.b3b646p+0"),
}

#: NVRTC options for activation.cu. Unlike the other fast-path modules it is compiled with FMA
#: contraction ON, like torch's own kernels (nvcc's default): torch's sigmoid kernel fuses expf's
#: last multiply with its "+ 1", and libdevice's expf/tanhf contract as in torch's build. Every
#: op of the reference's sequence is an explicit __fmul_rn/__fadd_rn/__fsub_rn, never fused.
#: With --fmad=false, sigmoid- and tanh-based results differ from torch's in some last bits.
#: Subnormals are kept (--ftz=false, torch's build too): with flush-to-zero, sigmoid(-88) is 0
#: instead of 6.05e-39, so silu(-88) is -0 instead of -5.3e-37 and a gated product 0 * inf is NaN
#: instead of inf. IEEE division and square root, as in torch.
ACTIVATION_COMPILE_OPTIONS = ("-std=c++17", "--fmad=true", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")

_SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
_VECTOR_WIDTH = {torch.float32: 4, torch.float16: 8, torch.bfloat16: 8}  # elements per 16 bytes
_THREADS = 256
_MAX_GRID_Y = 65535
#: The bf16 SiTU-GLU forward by table (act_fwd_situglu_table_bf16, see activation.cu): blocks of this many
#: threads, one wave of them walking the rows, for at least this many outputs (each block first fills its
#: tables, ~12 K function evaluations; below that the plain kernel is as fast).
_SITU_TABLE_THREADS = 1024
_SITU_TABLE_MIN_OUTPUTS = 1 << 20
#: The table kernel also adds a bias, but bias + SiTU-GLU measured slower with it on the H200 (88 % of the
#: copy against 94 % for the plain kernel, GPU run 8: benchmarks/results/FINDINGS.md), so only the bias-free
#: forward takes it (71 % -> 97 %); the tests turn this on to keep the bias path checked.
_SITU_TABLE_WITH_BIAS = False


@functools.lru_cache(maxsize=None)
def _group_module(group: str, device_index: int) -> Any:
    """activation.cu compiled with only ``group``'s kernels (see ACTIVATION_COMPILE_OPTIONS)."""
    source = _cuda.kernel_source(KERNEL_FILE)  # its shared headers inlined
    header = f"#define ACTIVATION_GROUP {ACTIVATION_GROUPS[group]}\n"
    return _compile.compile_module(header + source, ACTIVATION_COMPILE_OPTIONS, device_index, filename=KERNEL_FILE)


@functools.lru_cache(maxsize=None)
def _kernel(group: str, name: str, device_index: int) -> Any:
    return _group_module(group, device_index).get_function(name)


# ----------------------------------------------------------------- parameters
@functools.lru_cache(maxsize=64)
def _torch_reciprocal(value: float, device: torch.device) -> float:
    """The fp32 multiplier torch's CUDA ``t / value`` uses (``t * fl(1/value)``; the rounding
    of ``1/value`` changed between torch versions, so ask torch rather than guess)."""
    return (torch.ones(1, dtype=torch.float32, device=device) / value).item()


def _params(activation: str, params: dict[str, Any], device: torch.device) -> Optional[tuple]:
    """The kernel's (p0, p1, p2, p3) fp32 scalars, or None when a required parameter is missing."""
    f32 = _cuda.f32
    try:
        if activation == "clamped_swiglu":
            return (f32(float(params["limit"])), f32(float(params["alpha"])),
                    f32(float(params["glu_linear_offset"])), f32(0.0))
        if activation == "situglu":
            beta1, beta2 = float(params["beta1"]), float(params["beta2"])
            return (f32(beta1), f32(_torch_reciprocal(beta1, device)),
                    f32(beta2), f32(_torch_reciprocal(beta2, device)))
    except (KeyError, TypeError, ValueError):
        return None
    return (f32(0.0),) * 4


# --------------------------------------------------------------- launch shape
def _aligned(*tensors: Optional[torch.Tensor]) -> bool:
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _blocks(rows: int, n: int, v: int, device: torch.device, *, wave: Optional[int] = None):
    """``(grid, block)`` for ``rows`` rows of ``n`` elements, ``v`` per thread.

    Without ``wave``: a few rows per thread (the loop prefetches the next row) and
    several blocks per SM. With ``wave`` (the blocks the GPU holds at once, for
    kernels whose row blocks each write one partial row of column sums): one full
    wave, so no SM idles behind a partial second wave and the partial rows are few.
    """
    vectors = -(-n // v)
    tx = min(_THREADS, _pow2_at_least(vectors))
    ty = _THREADS // tx
    gx = -(-vectors // tx)
    row_blocks = -(-rows // ty)
    if wave is not None:
        gy = min(row_blocks, max(1, wave // gx))
    else:
        gy = min(row_blocks, max(-(-row_blocks // 4), -(-16 * _cuda.sm_count(device.index) // gx)))
    return (gx, max(1, min(gy, _MAX_GRID_Y))), (tx, ty)


#: Blocks per SM assumed when the occupancy query is unavailable (fits 64 registers per thread).
_FALLBACK_BLOCKS_PER_SM = 4


def _wave(group: str, name: str, device_index: int, threads: int, shared: int) -> int:
    """How many ``threads``-thread blocks of kernel ``name`` the whole GPU holds at once."""
    kernel = _kernel(group, name, device_index)
    return _cuda.resident_blocks(kernel, device_index, threads, shared, fallback_per_sm=_FALLBACK_BLOCKS_PER_SM)


def _partial_launch(group: str, name: str, rows: int, n: int, v: int, device: torch.device, shared_per_thread: int):
    """``(grid, block, shared)`` for a kernel writing one partial row per row block (see ``_blocks``)."""
    _, block = _blocks(rows, n, v, device)
    shared = block[0] * block[1] * shared_per_thread if block[1] > 1 else 0
    wave = _wave(group, name, device.index, block[0] * block[1], shared)
    grid, _ = _blocks(rows, n, v, device, wave=wave)
    return grid, block, shared


def _flat_shape(numel: int, vec_width: int, vec: bool) -> tuple[int, int]:
    """A (rows, n) factorization of a flat array: rows of up to 1024 vectors (or elements)."""
    unit = vec_width if vec else 1
    units = numel // unit
    width = math.gcd(units, 1024)
    return units // width, width * unit


# -------------------------------------------------------------------- launches
def _forward(x: torch.Tensor, bias: Optional[torch.Tensor], activation: str, p: tuple, *,
             want_pre: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    gated = activation in GATED_ACTIVATIONS
    width = x.shape[-1]
    n = width // 2 if gated else width
    rows = x.numel() // width
    y = torch.empty((*x.shape[:-1], n), dtype=x.dtype, device=x.device)
    pre = torch.empty_like(x) if want_pre else None
    vw = _VECTOR_WIDTH[x.dtype]
    if gated or bias is not None:
        vec = n % vw == 0 and _aligned(x, bias)
    else:
        vec = x.numel() % vw == 0 and _aligned(x)
        rows, n = _flat_shape(x.numel(), vw, vec)
    if (activation == "situglu" and vec and x.dtype == torch.bfloat16 and rows * n >= _SITU_TABLE_MIN_OUTPUTS
            and (bias is None or _SITU_TABLE_WITH_BIAS)):
        name = "act_fwd_situglu_table_bf16"
        grid, block = _situ_table_blocks(rows, n, x.device)
        args = (_cuda.ptr(x), _cuda.ptr(bias), _cuda.ptr(pre), _cuda.ptr(y), _cuda.i64(rows), _cuda.i64(n), *p)
        _cuda.launch(_kernel(activation, name, x.device.index), grid, block, args, device=x.device)
        return y, pre
    grid, block = _blocks(rows, n, vw if vec else 1, x.device)
    kernel = _kernel(activation, f"act_fwd_{activation}_{_SUFFIX[x.dtype]}", x.device.index)
    args = (_cuda.ptr(x), _cuda.ptr(bias), _cuda.ptr(pre), _cuda.ptr(y), _cuda.i64(rows), _cuda.i64(n),
            _cuda.i32(int(vec)), *p)
    _cuda.launch(kernel, grid, block, args, device=x.device)
    return y, pre


def _situ_table_blocks(rows: int, n: int, device: torch.device):
    """``(grid, block)`` of the SiTU-GLU table kernel: 8-element vectors, _SITU_TABLE_THREADS threads
    per block, one wave of blocks (each fills its tables once) walking the rows."""
    vectors = n // 8
    tx = min(_SITU_TABLE_THREADS, _pow2_at_least(vectors))
    ty = _SITU_TABLE_THREADS // tx
    gx = -(-vectors // tx)
    wave = _wave("situglu", "act_fwd_situglu_table_bf16", device.index, tx * ty, 0)
    gy = min(-(-rows // ty), max(1, wave // gx), _MAX_GRID_Y)
    return (gx, gy), (tx, ty)


def _backward(dy: torch.Tensor, x: torch.Tensor, activation: str, p: tuple, *,
              want_dbias: bool) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    gated = activation in GATED_ACTIVATIONS
    width = x.shape[-1]
    n = width // 2 if gated else width
    rows = x.numel() // width
    dx = torch.empty_like(x)
    vw = _VECTOR_WIDTH[x.dtype]
    if gated or want_dbias:
        vec = n % vw == 0 and _aligned(dy, x)
    else:
        vec = x.numel() % vw == 0 and _aligned(dy, x)
        rows, n = _flat_shape(x.numel(), vw, vec)
    v = vw if vec else 1
    name = f"act_bwd_{activation}_{_SUFFIX[x.dtype]}"
    partial, shared = None, 0
    if want_dbias:  # per-block column sums of dx in the block's scratch (both halves when gated)
        grid, block, shared = _partial_launch(activation, name, rows, n, v, x.device, v * 4 * (2 if gated else 1))
        partial = torch.empty((grid[1], width), dtype=torch.float32, device=x.device)
    else:
        grid, block = _blocks(rows, n, v, x.device)
    kernel = _kernel(activation, name, x.device.index)
    args = (_cuda.ptr(dy), _cuda.ptr(x), _cuda.ptr(dx), _cuda.ptr(partial), _cuda.i64(rows), _cuda.i64(n),
            _cuda.i32(int(vec)), *p)
    _cuda.launch(kernel, grid, block, args, device=x.device, shared_mem=shared)
    dbias = _finalize_columns(partial, x.dtype) if want_dbias else None
    return dx, dbias


def _column_sums(g: torch.Tensor) -> torch.Tensor:
    """fp32 sum over every leading dim of ``g``, rounded to ``g``'s dtype (two launches)."""
    n = g.shape[-1]
    rows = g.numel() // n
    vw = _VECTOR_WIDTH[g.dtype]
    vec = n % vw == 0 and _aligned(g)
    v = vw if vec else 1
    name = f"dbias_partial_{_SUFFIX[g.dtype]}"
    grid, block, shared = _partial_launch("dbias", name, rows, n, v, g.device, v * 4)
    partial = torch.empty((grid[1], n), dtype=torch.float32, device=g.device)
    kernel = _kernel("dbias", name, g.device.index)
    args = (_cuda.ptr(g), _cuda.ptr(partial), _cuda.i64(rows), _cuda.i64(n), _cuda.i32(int(vec)))
    _cuda.launch(kernel, grid, block, args, device=g.device, shared_mem=shared)
    return _finalize_columns(partial, g.dtype)


def _finalize_columns(partial: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Column sums of the fp32 partial rows, rounded to ``dtype`` (``column_sums.cuh``: stripes of every
    ``COLUMN_SUM_STRIPES``-th row, then the stripes in order)."""
    parts, width = partial.shape
    out = torch.empty(width, dtype=dtype, device=partial.device)
    kernel = _kernel("dbias", f"dbias_finalize_{_SUFFIX[dtype]}", partial.device.index)
    grid, block, vc = _cuda.column_sums_shape(width, partial.device)
    args = (_cuda.ptr(partial), _cuda.i64(parts), _cuda.i64(width), _cuda.ptr(out), _cuda.i32(vc))
    _cuda.launch(kernel, grid, block, args, device=partial.device)
    return out


# ----------------------------------------------------------------- eligibility
def _handles(t: torch.Tensor) -> bool:
    return t.is_cuda and t.dtype in _SUFFIX and t.dim() > 0 and t.numel() > 0


def _known_shape(x: torch.Tensor, activation: str) -> bool:
    if activation in UNARY_ACTIVATIONS:
        return True
    return activation in GATED_ACTIVATIONS and x.shape[-1] % 2 == 0


def _matches(t: torch.Tensor, like: torch.Tensor) -> bool:
    return _handles(t) and t.dtype == like.dtype and t.device == like.device


class ElementwiseKernels:
    """Mixin overriding the element-wise kernels of ``KernelBackend`` (see the module docstring)."""

    def activation_forward(self, x: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
        p = _params(activation, params, x.device) if _handles(x) and _known_shape(x, activation) else None
        if p is None:
            return super().activation_forward(x, activation, **params)
        y, _ = _forward(x.contiguous(), None, activation, p, want_pre=False)
        return y

    def activation_backward(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> torch.Tensor:
        p = self._backward_params(grad_output, x, activation, params)
        if p is None:
            return super().activation_backward(grad_output, x, activation, **params)
        dx, _ = _backward(grad_output.contiguous(), x.contiguous(), activation, p, want_dbias=False)
        return dx

    def bias_activation_forward(
        self, x: torch.Tensor, bias: Optional[torch.Tensor], activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if bias is None:
            return self.activation_forward(x, activation, **params), x
        ok = (_handles(x) and _known_shape(x, activation) and _matches(bias, x)
              and tuple(bias.shape) == (x.shape[-1],))
        p = _params(activation, params, x.device) if ok else None
        if p is None:
            return super().bias_activation_forward(x, bias, activation, **params)
        # identity: act(pre) == pre bit for bit, so one output serves both.
        identity = activation == "identity"
        y, pre = _forward(x.contiguous(), bias.contiguous(), activation, p, want_pre=not identity)
        return y, (y if identity else pre)

    def activation_backward_dbias(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        p = self._backward_params(grad_output, x, activation, params)
        if p is None:
            return super().activation_backward_dbias(grad_output, x, activation, **params)
        return _backward(grad_output.contiguous(), x.contiguous(), activation, p, want_dbias=True)

    def dbias(self, grad_output: torch.Tensor) -> torch.Tensor:
        if not _handles(grad_output):
            return super().dbias(grad_output)
        return _column_sums(grad_output.contiguous())

    @staticmethod
    def _backward_params(dy: torch.Tensor, x: torch.Tensor, activation: str, params: dict) -> Optional[tuple]:
        """Kernel parameters when the fast path handles this backward, else None."""
        if not (_handles(x) and _known_shape(x, activation) and _matches(dy, x)):
            return None
        n = x.shape[-1] // 2 if activation in GATED_ACTIVATIONS else x.shape[-1]
        if tuple(dy.shape) != (*x.shape[:-1], n):
            return None
        return _params(activation, params, x.device)
