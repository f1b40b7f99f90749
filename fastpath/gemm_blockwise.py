"""FP8 block-scaled GEMMs (``Float8BlockScaling``) by cuBLAS on Hopper, through ``torch._scaled_mm``.

cuBLASLt 12.9 and later multiply FP8 operands with fp32 scales per 1x128 block or per 128x128 tile on sm_90
(TransformerEngine runs its Float8BlockScaling GEMMs there: compute capability 9.0 and CUDA 12.9). torch's
``_scaled_mm`` exposes it for the operand pairs (1x128, 128x128), (128x128, 1x128) and (1x128, 1x128): a
Linear's forward (x 1x128, W 128x128), dgrad (dy 1x128, W 128x128) and wgrad (dy 1x128, x 1x128). Each 128-long
slice of the contracted dim is accumulated by the tensor cores and then scaled and added in fp32 (split
accumulation), so the result matches the reference's exact dequantize-then-fp32 GEMM within the FP8
tolerance, like the per-tensor path.

Layouts. A GEMM reads each operand as ``D`` of shape ``(R, C)``, ``C`` the contracted dim, row-major: the
row-wise data of a tensor whose last dim is contracted, the column-wise (transposed) data otherwise. refops
keeps the scale inverses of ``D`` in TE's GEMM-ready layout ``S``:

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

from refops.quantization import Float8BlockwiseQTensor
from refops.quantization.quantizer import torch_fp8_dtype

__all__ = ["BlockwiseSupport", "blockwise_scaled_mm_operands", "support", "scale_view"]

BLOCK = 128
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


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def scale_view(s: torch.Tensor, rows: int, cols: int, *, tiles: bool, convention: str) -> Optional[torch.Tensor]:
    """The scale tensor ``_scaled_mm`` checks against an operand ``D`` of shape ``(rows, cols)`` (see the module
    docstring) from refops's layout ``s``: a view where the strides allow it, else a small copy. None when ``s``
    is too small for ``D``, or the tile convention is "aligned" and ``cols / 128`` is not a multiple of 4."""
    if s is None or s.dim() != 2 or s.dtype != torch.float32 or s.stride(1) != 1:
        return None
    cb = _ceil_div(cols, BLOCK)
    if not tiles:  # (cb, >= rows): blocks of one row; _scaled_mm wants (rows, cb) with strides (1, rows)
        if s.shape[0] < cb or s.shape[1] < rows:
            return None
        valid = s[:cb, :rows]
        if cb > 1 and valid.stride(0) != rows:
            valid = valid.contiguous()
        return valid.t()
    rb = _ceil_div(rows, BLOCK)
    if s.shape[0] < rb or s.shape[1] < cb:
        return None
    valid = s[:rb, :cb]
    if rb == 1:  # one row of tiles: no row stride to agree on
        return valid
    padded_stride = _ceil_div(cb, 4) * 4
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


def _operand(t: Float8BlockwiseQTensor, columnwise: bool) -> tuple[Optional[torch.Tensor], Optional[torch.Tensor]]:
    """``(D, S)``: the data the GEMM reads as ``(R, C)`` (C contracted) and its scales, or Nones."""
    data = t._columnwise_data if columnwise else t._rowwise_data
    scale = t._columnwise_scale_inv if columnwise else t._rowwise_scale_inv
    if data is None or scale is None or not data.is_contiguous() or data.dim() < 1:
        return None, None
    d = data.reshape(data.shape[0], -1) if columnwise else data.reshape(-1, data.shape[-1])
    return d, scale


def _build(a: Float8BlockwiseQTensor, b: Float8BlockwiseQTensor, trans_a: bool, trans_b: bool,
           convention: str) -> Optional[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]:
    """``(mat1, mat2, scale_a, scale_b)`` for ``op(a) @ op(b)``, or None (see the module docstring)."""
    if a._is_2D_scaled and b._is_2D_scaled:
        return None  # no (128x128, 128x128) GEMM in cuBLAS
    fp8_a, fp8_b = torch_fp8_dtype(a._fp8_dtype), torch_fp8_dtype(b._fp8_dtype)
    if fp8_a == fp8_b == torch.float8_e5m2:
        return None
    # op(a) = a contracts a's last dim (row-wise data); op(a) = a^T its leading dims (column-wise data).
    d_a, s_a = _operand(a, columnwise=trans_a)
    # op(b) = b^T contracts b's last dim (row-wise data); op(b) = b its leading dims (column-wise data).
    d_b, s_b = _operand(b, columnwise=not trans_b)
    if d_a is None or d_b is None:
        return None
    (m, k), (n, k_b) = d_a.shape, d_b.shape
    if k != k_b or m % BLOCK or n % BLOCK or k % BLOCK or min(m, n, k) == 0:
        return None
    scale_a = scale_view(s_a, m, k, tiles=a._is_2D_scaled, convention=convention)
    scale_b = scale_view(s_b, n, k, tiles=b._is_2D_scaled, convention=convention)
    if scale_a is None or scale_b is None:
        return None
    return d_a.view(fp8_a), d_b.view(fp8_b).t(), scale_a, scale_b.t()


def blockwise_scaled_mm_operands(a: torch.Tensor, b: torch.Tensor, trans_a: bool, trans_b: bool,
                                 out_dtype: torch.dtype) -> Optional[tuple]:
    """``(mat1, mat2, scale_a, scale_b)`` for ``torch._scaled_mm`` computing ``op(a) @ op(b)`` into
    ``out_dtype``, or None when the pair does not qualify (see the module docstring)."""
    if not (type(a) is Float8BlockwiseQTensor and type(b) is Float8BlockwiseQTensor):
        return None
    if a.dim() < 2 or b.dim() < 2 or not a.is_cuda or b.device != a.device:
        return None
    found = support(a.device)
    if found is None or out_dtype not in found.out_dtypes:
        return None
    return _build(a, b, trans_a, trans_b, found.tiles)


# ------------------------------------------------------------------------------------------ the probe
def _probe_operand(rows: int, cols: int, tiles: bool, g: torch.Generator, device: torch.device):
    """A quantized operand whose 1x128 blocks and 128x128 tiles have scales that differ from their neighbours':
    ``x = randn * 2^(T + R)``, T per 128x128 tile in [-3, 2], R per (row, 128 columns) in [-2, 0]."""
    from refops.quantization import DType, Float8BlockQuantizer

    tile = torch.randint(-3, 3, (rows // BLOCK, cols // BLOCK), generator=g)
    row = torch.randint(-2, 1, (rows, cols // BLOCK), generator=g)
    exponent = (tile.repeat_interleave(BLOCK, 0) + row).repeat_interleave(BLOCK, 1)
    x = torch.randn(rows, cols, generator=g) * torch.exp2(exponent.float())
    quantizer = Float8BlockQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=True,
                                     block_scaling_dim=2 if tiles else 1)
    return quantizer(x.to(device=device, dtype=torch.bfloat16))


def _probe_case(a, b, trans_a: bool, trans_b: bool, out_dtype: torch.dtype, convention: str) -> bool:
    """One GEMM by block-scaled ``_scaled_mm`` against the float64 product of the dequantized operands."""
    operands = _build(a, b, trans_a, trans_b, convention)
    if operands is None:
        return False
    try:
        # The aten op directly: callers that count torch._scaled_mm calls count GEMMs, not this probe.
        got = torch.ops.aten._scaled_mm.default(*operands, None, None, out_dtype, False)
    except Exception:  # an older torch or cuBLAS, or a layout this torch does not accept
        return False
    a64 = a.dequantize(dtype=torch.float32, usage="columnwise" if trans_a else "rowwise").double()
    b64 = b.dequantize(dtype=torch.float32, usage="rowwise" if trans_b else "columnwise").double()
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
