"""FP8 block-scaled GEMMs (``Float8BlockScaling``) by cuBLAS on Hopper, through ``torch._scaled_mm``.

cuBLASLt 12.9 and later multiply FP8 operands with fp32 scales per 1x128 block or per 128x128 tile on sm_90
(TransformerEngine runs its Float8BlockScaling GEMMs there: compute capability 9.0 and CUDA 12.9). torch's
``_scaled_mm`` exposes it for the operand pairs (1x128, 128x128), (128x128, 1x128) and (1x128, 1x128): a
Linear's forward (x 1x128, W 128x128), dgrad (dy 1x128, W 128x128) and wgrad (dy 1x128, x 1x128). Each 128-long
slice of the contracted dim is accumulated by the tensor cores and then scaled and added in fp32 (split
accumulation), so the result matches the reference's exact dequantize-then-fp32 GEMM within the FP8
tolerance, like the per-tensor path.

Layouts. A GEMM reads each operand as ``D`` of shape ``(R, C)``, ``C`` the contracted dim, row-major: the
row-wise data of a tensor whose last dim is contracted, the column-wise (transposed) data otherwise; both are
the ``data`` of its ``GemmOperand`` (the kernel interface's seam: nothing else of the tensor is read). refops
keeps the scale inverses of ``D`` (``GemmOperand.scale_inv``) in TE's GEMM-ready layout ``S``
(:func:`refops.layouts.float8_block_scale_shape`):

* 1x128 blocks: ``S`` of shape ``(ceil(C/128), round_up(R, 4))``, ``S[c, r]`` the scale of row ``r``'s block ``c``;
* 128x128 tiles: ``S`` of shape ``(ceil(R/128), round_up(ceil(C/128), 4))``, ``S[r, c]`` the scale of tile ``(r, c)``.

``_scaled_mm(mat1, mat2, scale_a, scale_b)`` takes ``mat1 = D_a`` (M, K) and ``mat2 = D_b.t()`` (K, N), and
checks ``scale_a`` against ``D_a`` and ``scale_b.t()`` against ``D_b``: a 1x128 scale of ``D`` (R, C) must be
``(R, C/128)`` with strides ``(1, R)``, which is ``S[:, :R].t()`` itself when ``R % 4 == 0``; a 128x128 scale
must be ``(R/128, C/128)`` with unit column stride and a row stride of ``C/128`` (some torch versions) or
``round_up(C/128, 4)`` (others): ``S[:, :C/128]`` itself in the second case, a small copy in the first; the two
agree when ``C/128`` is a multiple of 4 (every Linear whose sizes are multiples of 512). torch hands cuBLAS only
the pointer, and cuBLAS reads the scales at the strides it assumes, so a layout torch accepts can still be read
wrongly: where torch checks the compact stride and cuBLAS reads the padded one (TE's layout), the right scales
are ``S`` itself behind a view with the compact strides ("padded_behind_compact"). Which convention gives right
results, and whether this torch and cuBLAS take block scales at all, is found once per device by a probe
(:func:`support`): a Linear's three GEMMs on small operands whose blocks and tiles have different scales, each
checked element-wise against the exact product of the dequantized operands, per output dtype.
Any other case (dims not multiples of 128, two 128x128 operands, E5M2 x E5M2, an output dtype the probe found
wrong or unsupported) gets None: the caller dequantizes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from refops.kernels import current_backend
from refops.kernels.gemm_operand import GemmOperand, dequantize_gemm_operand
from refops.layouts import FP8_BLOCK_SIZE as BLOCK
from refops.layouts import ceil_div

from .gemm_operands import read_operand

__all__ = ["BlockwiseSupport", "blockwise_scaled_mm_operands", "support", "scale_view"]

#: The output dtypes the probe tries.
_OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


#: How the rows of a 128x128 tile-scale tensor are laid out for ``_scaled_mm``, as (the row stride torch checks,
#: the row stride cuBLAS reads): "compact" (C/128 both), "padded" (round_up(C/128, 4) both),
#: "padded_behind_compact" (torch checks C/128, cuBLAS reads round_up(C/128, 4)), or "aligned" (none of them
#: worked: only C/128 % 4 == 0, where they all agree).
TILE_CONVENTIONS = ("compact", "padded", "padded_behind_compact", "aligned")


@dataclasses.dataclass(frozen=True)
class BlockwiseSupport:
    """What this torch and cuBLAS accept on one device: the tile-scale convention (``TILE_CONVENTIONS``) and
    the output dtypes whose results the probe found right."""

    tiles: str
    out_dtypes: frozenset


_SUPPORT: dict[int, Optional[BlockwiseSupport]] = {}


def support(device: torch.device) -> Optional[BlockwiseSupport]:
    """Block-scaled ``_scaled_mm`` on ``device``: None where it does not run or gives wrong results.

    Probed once per device (a few 256 x 384 GEMMs against the exact product); never while a CUDA graph is
    being captured (the probe reads results on the host), when the answer is None for that call only."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index in _SUPPORT:
        return _SUPPORT[index]
    if torch.cuda.is_current_stream_capturing():
        return None
    try:
        found = _probe(torch.device("cuda", index))
    except Exception:  # the probe's own quantization or dequantization failed: do not use the path
        found = None
    _SUPPORT[index] = found
    return found


def scale_view(s: torch.Tensor, rows: int, cols: int, *, tiles: bool, convention: str) -> Optional[torch.Tensor]:
    """The scale tensor ``_scaled_mm`` checks against an operand ``D`` of shape ``(rows, cols)`` (see the module
    docstring) from refops's layout ``s``: a view where the strides allow it, else a small copy. None when ``s``
    is too small for ``D``, or the tile convention is "aligned" and ``cols / 128`` is not a multiple of 4."""
    if s is None or s.dim() != 2 or s.dtype != torch.float32 or s.stride(1) != 1:
        return None
    cb = ceil_div(cols, BLOCK)
    if not tiles:  # (cb, >= rows): blocks of one row; _scaled_mm wants (rows, cb) with strides (1, rows)
        if s.shape[0] < cb or s.shape[1] < rows:
            return None
        valid = s[:cb, :rows]
        if cb > 1 and valid.stride(0) != rows:
            valid = valid.contiguous()
        return valid.t()
    rb = ceil_div(rows, BLOCK)
    if s.shape[0] < rb or s.shape[1] < cb:
        return None
    valid = s[:rb, :cb]
    if rb == 1:  # one row of tiles: no row stride to agree on
        return valid
    padded_stride = ceil_div(cb, 4) * 4
    if convention == "aligned":
        return valid if cb == padded_stride and valid.stride(0) == cb else None
    if convention == "padded_behind_compact":
        # cuBLAS reads rows padded_stride apart from the pointer; torch checks a compact view of the same pointer
        padded = valid if valid.stride(0) == padded_stride else _padded_copy(valid, padded_stride)
        return padded.as_strided((rb, cb), (cb, 1))
    row_stride = padded_stride if convention == "padded" else cb
    if valid.stride(0) == row_stride:
        return valid
    if convention == "compact":
        return valid.contiguous()
    return _padded_copy(valid, row_stride)


def _padded_copy(valid: torch.Tensor, row_stride: int) -> torch.Tensor:
    """``valid`` (rows, cols) copied into rows ``row_stride`` apart (zeros between them)."""
    out = torch.zeros(valid.shape[0], row_stride, dtype=valid.dtype, device=valid.device)
    out[:, : valid.shape[1]] = valid
    return out[:, : valid.shape[1]]


def _operands(a: object, b: object, trans_a: bool,
              trans_b: bool) -> tuple[Optional[GemmOperand], Optional[GemmOperand]]:
    """The ``GemmOperand`` of each side in the usage the GEMM reads, each None unless it is FP8 block-scaled:
    op(a) = a contracts a's last dim (row-wise data), op(a) = a^T its leading dims (column-wise data); op(b) = b^T
    contracts b's last dim (row-wise data), op(b) = b its leading dims (column-wise data)."""
    a_op = read_operand(a, "columnwise" if trans_a else "rowwise", "a")
    b_op = read_operand(b, "rowwise" if trans_b else "columnwise", "b")
    blockwise = [op if op is not None and op.format == "float8_block" else None for op in (a_op, b_op)]
    return blockwise[0], blockwise[1]


def _data(op: GemmOperand) -> Optional[torch.Tensor]:
    """``D``: the bytes the GEMM reads as ``(R, C)`` (C contracted), or None if absent or not contiguous."""
    data = op.data
    return data if data is not None and op.scale_inv is not None and data.is_contiguous() else None


def _build(a: object, b: object, trans_a: bool, trans_b: bool,
           convention: str) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(mat1, mat2, scale_a, scale_b)`` for ``op(a) @ op(b)`` of two FP8 block-scaled operands (``GemmOperand``
    sources), or None (see the module docstring)."""
    a_op, b_op = _operands(a, b, trans_a, trans_b)
    if a_op is None or b_op is None:
        return None
    tiles_a, tiles_b = a_op.block_scaling_dim == 2, b_op.block_scaling_dim == 2
    if tiles_a and tiles_b:
        return None  # no (128x128, 128x128) GEMM in cuBLAS
    if a_op.fp8_dtype == b_op.fp8_dtype == torch.float8_e5m2:
        return None
    d_a, d_b = _data(a_op), _data(b_op)
    if d_a is None or d_b is None:
        return None
    (m, k), (n, k_b) = d_a.shape, d_b.shape
    if k != k_b or m % BLOCK or n % BLOCK or k % BLOCK or min(m, n, k) == 0:
        return None
    scale_a = scale_view(a_op.scale_inv, m, k, tiles=tiles_a, convention=convention)
    scale_b = scale_view(b_op.scale_inv, n, k, tiles=tiles_b, convention=convention)
    if scale_a is None or scale_b is None:
        return None
    return d_a.view(a_op.fp8_dtype), d_b.view(b_op.fp8_dtype).t(), scale_a, scale_b.t()


def blockwise_scaled_mm_operands(a: object, b: object, trans_a: bool, trans_b: bool,
                                 out_dtype: torch.dtype) -> Optional[tuple]:
    """``(mat1, mat2, scale_a, scale_b)`` for ``torch._scaled_mm`` computing ``op(a) @ op(b)`` into
    ``out_dtype`` (``a``, ``b``: quantized tensors or their ``GemmOperand``), or None when the pair does not
    qualify (see the module docstring)."""
    a_op, b_op = _operands(a, b, trans_a, trans_b)
    if a_op is None or b_op is None or a_op.device.type != "cuda" or b_op.device != a_op.device:
        return None
    found = support(a_op.device)
    if found is None or out_dtype not in found.out_dtypes:
        return None
    return _build(a_op, b_op, trans_a, trans_b, found.tiles)


# ------------------------------------------------------------------------------------------ the probe
def _probe_operand(rows: int, cols: int, tiles: bool, g: torch.Generator,
                   device: torch.device) -> dict[str, GemmOperand]:
    """An operand whose 1x128 blocks and 128x128 tiles have scales that differ from their neighbours':
    ``x = randn * 2^(T + R)``, T per 128x128 tile in [-3, 2], R per (row, 128 columns) in [-2, 0], quantized by
    the active backend's kernel as ``Float8BlockQuantizer(E4M3)`` does; its ``GemmOperand`` per usage."""
    tile = torch.randint(-3, 3, (rows // BLOCK, cols // BLOCK), generator=g)
    row = torch.randint(-2, 1, (rows, cols // BLOCK), generator=g)
    exponent = (tile.repeat_interleave(BLOCK, 0) + row).repeat_interleave(BLOCK, 1)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(exponent.float())
    dim = 2 if tiles else 1
    row_data, row_scale, col_data, col_scale = current_backend().quantize_float8_block(
        x.to(device=device, dtype=torch.bfloat16), fp8_dtype=torch.float8_e4m3fn, rowwise=True, columnwise=True,
        block_scaling_dim=dim, force_pow_2_scales=True, amax_epsilon=0.0)
    layout = dict(format="float8_block", shape=(rows, cols), fp8_dtype=torch.float8_e4m3fn, block_scaling_dim=dim)
    return {"rowwise": GemmOperand(usage="rowwise", data=row_data, scale_inv=row_scale, **layout),
            "columnwise": GemmOperand(usage="columnwise", data=col_data, scale_inv=col_scale, **layout)}


def _probe_case(a: dict[str, GemmOperand], b: dict[str, GemmOperand], trans_a: bool, trans_b: bool,
                out_dtype: torch.dtype, convention: str) -> bool:
    """One GEMM by block-scaled ``_scaled_mm`` against the float64 product of the dequantized operands."""
    a_op, b_op = a["columnwise" if trans_a else "rowwise"], b["rowwise" if trans_b else "columnwise"]
    operands = _build(a_op, b_op, trans_a, trans_b, convention)
    if operands is None:
        return False
    try:
        # The aten op directly: callers that count torch._scaled_mm calls count GEMMs, not this probe.
        got = torch.ops.aten._scaled_mm.default(*operands, None, None, out_dtype, False)
    except Exception:  # an older torch or cuBLAS, or a layout this torch does not accept
        return False
    a64 = dequantize_gemm_operand(a_op, current_backend(), torch.float32).double()
    b64 = dequantize_gemm_operand(b_op, current_backend(), torch.float32).double()
    a64 = a64.t() if trans_a else a64
    b64 = b64.t() if trans_b else b64
    expected = a64 @ b64
    if got.shape != expected.shape or got.dtype != out_dtype:
        return False
    # Element-wise against the magnitude of each dot product's terms: FP8 accumulation and one rounding to 16
    # bits stay under 2^-8 of it; a scale applied to the wrong block is off by a factor of 2 or more.
    bound = a64.abs() @ b64.abs()
    error = (got.double() - expected).abs()
    return bool((error <= 2.0 ** -6 * bound).all())


def _probe(device: torch.device) -> Optional[BlockwiseSupport]:
    """Which tile-scale convention and output dtypes give right results for a Linear's three GEMMs: first with
    3 tile columns (hidden 384; the conventions differ), then, if none works, with 4 (where they agree)."""
    if torch.cuda.get_device_capability(device)[0] != 9:
        return None  # block-scaled cuBLAS GEMMs with these scale layouts: Hopper only (Blackwell: MXFP8)
    g = torch.Generator(device="cpu").manual_seed(0)
    # No autocast (gemm_path may be asked inside one): the reference product is float64.
    with torch.no_grad(), torch.autocast("cuda", enabled=False):
        for tokens, hidden, ffn, conventions in ((256, 384, 384, ("compact", "padded", "padded_behind_compact")),
                                                 (256, 512, 512, ("aligned",))):
            x = _probe_operand(tokens, hidden, False, g, device)
            w = _probe_operand(ffn, hidden, True, g, device)
            dy = _probe_operand(tokens, ffn, False, g, device)
            cases = [(x, w, False, True), (dy, w, False, False), (dy, x, True, False)]  # fprop, dgrad, wgrad
            for convention in conventions:
                dtypes = frozenset(d for d in _OUT_DTYPES
                                   if all(_probe_case(a, b, ta, tb, d, convention) for a, b, ta, tb in cases))
                if dtypes:
                    return BlockwiseSupport(convention, dtypes)
    return None
