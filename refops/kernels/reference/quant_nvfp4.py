"""NVFP4 numerics: two-level block scaling, stochastic rounding, 4over6, quantize and dequantize.

The scale factors are in :mod:`.nvfp4_scales`, the random Hadamard transform in
:mod:`.hadamard`, the layouts and the scale swizzle in :mod:`refops.layouts`, the
emulated GEMM in :mod:`.gemm_nvfp4`.

This file is the byte-exact specification a CUDA kernel is checked against
(``docs/recipes/nvfp4.md``). Notation: ``RN(.)`` is one IEEE
fp32 round-to-nearest-even step, ``fl(c)`` the constant ``c`` rounded to fp32,
``Q_E4M3`` the saturating E4M3 cast, ``A`` a global amax, ``E`` the E4M3 range
the global scale targets (448, or 256 for 4over6 tensors), ``fminf`` the C
function (a NaN operand yields the other operand).

Every arithmetic step below is a separate fp32 torch operation, so each one
rounds exactly once; no step is fused. Amaxes are exact and skip NaN, like
``fmaxf`` starting from 0.

Layouts (``M`` rows, ``K`` columns of the 2D input; :mod:`refops.layouts`):

* rowwise data ``(M, K/2)`` uint8, two E2M1 codes per byte, element ``2j`` in
  the low nibble; scales E4M3 bytes ``[m, k/16]`` zero-padded to
  :func:`refops.layouts.nvfp4_scale_shape`;
* columnwise data is the transposed tensor ``(K, M/2)``, blocked along ``M``;
  scales ``[k, m/16]``, padded likewise;
* amax: shape ``(1,)`` fp32, or one value per data row when row-scaled.
"""

from __future__ import annotations

import dataclasses

import torch

from ...formats import (
    E4M3,
    e2m1_round_nearest_even,
    e2m1_stochastic_round,
    e2m1_to_fp32,
    pack_e2m1,
    unpack_e2m1,
)
from ...layouts import NVFP4_BLOCK_SIZE as BLOCK
from ...layouts import nvfp4_scale_shape, rows_cols, zero_padded
from .hadamard import hadamard_transform_16
from .nvfp4_scales import (
    fl,
    nvfp4_4over6_block_scales,
    nvfp4_block_encode_multiplier,
    nvfp4_block_scale,
    nvfp4_global_scale,
)
from .nvfp4_options import check_random_bytes, validate_options
from .quant_float8 import abs_max

__all__ = [
    "BLOCK",
    "check_random_bytes",
    "validate_options",
    "NVFP4QuantizeResult",
    "nvfp4_amax",
    "quantize_nvfp4",
    "dequantize_nvfp4",
]


# ------------------------------------------------------------------ helpers
def _block_amax(x: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """Amax per 1x16 block (``tile_rows`` 1) or per 16x16 tile repeated over its rows: ``(R, C/16)``."""
    rows, cols = x.shape
    if rows == 0 or cols == 0:
        return torch.zeros(rows, cols // BLOCK, dtype=torch.float32, device=x.device)
    block_amax = abs_max(x.view(rows, cols // BLOCK, BLOCK), dim=2)
    if tile_rows == 1:
        return block_amax
    # A tile's amax is the max of its 16 rows' block amaxes.
    tiles = block_amax.view(rows // BLOCK, BLOCK, cols // BLOCK).amax(dim=1)
    return tiles.repeat_interleave(BLOCK, dim=0)


def _global_amax(x: torch.Tensor, per_row: bool) -> torch.Tensor:
    """Exact NaN-skipping amax: shape ``(1,)``, or ``(R,)`` with ``per_row``."""
    if per_row:
        if x.shape[1] == 0:
            return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
        return abs_max(x, dim=1)
    if x.numel() == 0:
        return torch.zeros(1, dtype=torch.float32, device=x.device)
    return abs_max(x).reshape(1)


def _pad_scales(scale_bytes: torch.Tensor) -> torch.Tensor:
    """Compact scale bytes ``(R, C/16)`` of an orientation's data ``(R, C)`` in their padded layout."""
    rows, blocks = scale_bytes.shape
    return zero_padded(scale_bytes, nvfp4_scale_shape((rows, blocks * BLOCK)))


# ---------------------------------------------------------------- quantize
@dataclasses.dataclass(frozen=True)
class NVFP4QuantizeResult:
    """Plain tensors produced by :func:`quantize_nvfp4` (``None`` for an orientation not requested).

    ``*_data`` packed E2M1 uint8, ``*_scale`` padded E4M3 bytes (uint8),
    ``*_amax`` fp32 ``(1,)`` or per data row; ``e4m3_max`` is the ``E`` used for
    ``S_enc`` (448, or 256/448 under 4over6), needed to dequantize and for GEMM alpha.
    """

    rowwise_data: torch.Tensor | None
    rowwise_scale: torch.Tensor | None
    rowwise_amax: torch.Tensor | None
    columnwise_data: torch.Tensor | None
    columnwise_scale: torch.Tensor | None
    columnwise_amax: torch.Tensor | None
    e4m3_max: float


def _scaled_blocks(blocks: torch.Tensor, s_b: torch.Tensor, s_dec: torch.Tensor) -> torch.Tensor:
    """``RN(x * enc_b)`` for ``blocks`` of shape ``(R, C/16, 16)``."""
    return blocks * nvfp4_block_encode_multiplier(s_b, s_dec)[..., None]


def _sum_rows_of_tiles(err: torch.Tensor) -> torch.Tensor:
    """Sum the 16 row errors of each tile in the kernel's warp-shuffle tree order, repeat per row.

    ``(r, r+8) -> (r, r+4) -> (r, r+2) -> (r, r+1)``, each addition one RN.
    """
    e = err.view(-1, BLOCK, err.shape[-1])
    e = e[:, 0:8] + e[:, 8:16]
    e = e[:, 0:4] + e[:, 4:8]
    e = e[:, 0:2] + e[:, 2:4]
    return (e[:, 0] + e[:, 1]).repeat_interleave(BLOCK, dim=0)


def _4over6_error(
    blocks: torch.Tensor, codes: torch.Tensor, s_c: torch.Tensor, amax: torch.Tensor, e4m3_max: float, err_mode: str
) -> torch.Tensor:
    """Sequential fp32 error of one candidate per block, elements ``i = 0..15`` in order.

    ``val = RN(RN(RN(e2m1(q_i) * float(s_c)) * A) / fl(6*E))``;
    ``diff = RN(val - x_i)``; ``err = RN(err + |diff|)`` (MAE) or
    ``RN(err + RN(diff * diff))`` (MSE), starting from ``err = 0``.
    """
    decoded = e2m1_to_fp32(codes)
    scale = s_c.to(torch.float32)
    denominator = fl(6.0 * e4m3_max, blocks)
    err = torch.zeros_like(scale)
    for i in range(BLOCK):
        val = torch.div(decoded[..., i] * scale * amax, denominator)
        diff = val - blocks[..., i]
        err = err + (diff * diff if err_mode == "MSE" else diff.abs())
    return err


def _quantize_2d_orientation(
    x: torch.Tensor,
    amax: torch.Tensor,
    *,
    tile_rows: int,
    random_bytes: torch.Tensor | None,
    use_4over6: bool,
    e4m3_max: float,
    err_mode: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize fp32 ``x`` ``(R, C)`` blocked along ``C``: returns packed codes and compact scale bytes."""
    rows, cols = x.shape
    blocks = x.view(rows, cols // BLOCK, BLOCK)
    block_amax = _block_amax(x, tile_rows)
    a = amax.view(-1, 1)
    s_enc, s_dec = nvfp4_global_scale(a, e4m3_max=e4m3_max)
    if use_4over6:
        s4, s6 = nvfp4_4over6_block_scales(block_amax, s_enc)
        codes4 = e2m1_round_nearest_even(_scaled_blocks(blocks, s4, s_dec))
        codes6 = e2m1_round_nearest_even(_scaled_blocks(blocks, s6, s_dec))
        err4 = _4over6_error(blocks, codes4, s4, a, e4m3_max, err_mode)
        err6 = _4over6_error(blocks, codes6, s6, a, e4m3_max, err_mode)
        if tile_rows == BLOCK:
            err4, err6 = _sum_rows_of_tiles(err4), _sum_rows_of_tiles(err6)
        pick_map4 = err4 < err6  # ties (and NaN errors) choose map-to-6
        codes = torch.where(pick_map4[..., None], codes4, codes6)
        s_b = torch.where(pick_map4, s4.view(torch.uint8), s6.view(torch.uint8))
    else:
        s_b_fp8 = nvfp4_block_scale(block_amax, s_enc)
        scaled = _scaled_blocks(blocks, s_b_fp8, s_dec)
        if random_bytes is None:
            codes = e2m1_round_nearest_even(scaled)
        else:
            codes = e2m1_stochastic_round(scaled, random_bytes.reshape(rows, cols // BLOCK, BLOCK))
        s_b = s_b_fp8.view(torch.uint8)
    return pack_e2m1(codes.view(rows, cols)), s_b


def _given_amax(amax: torch.Tensor) -> torch.Tensor:
    return amax.detach().to(torch.float32).reshape(-1)


def nvfp4_amax(
    x2d: torch.Tensor, *, rowwise: bool, columnwise: bool, with_rht: bool = False, with_random_sign_mask: bool = True,
    row_scaled: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The ``A`` that :func:`quantize_nvfp4` would compute per orientation: ``(rowwise, columnwise)``.

    Column-wise it is taken on ``xᵀ`` after the RHT when ``with_rht``; per data row
    with ``row_scaled``; None for an orientation not asked for.
    """
    row = _global_amax(x2d.to(torch.float32), per_row=row_scaled) if rowwise else None
    col = None
    if columnwise:
        source_t = x2d.t().contiguous()
        if with_rht:
            source_t = hadamard_transform_16(source_t, random_sign_mask=with_random_sign_mask)
        col = _global_amax(source_t.to(torch.float32), per_row=row_scaled)
    return row, col


def quantize_nvfp4(
    x2d: torch.Tensor,
    *,
    rowwise: bool = True,
    columnwise: bool = True,
    with_2d_quantization: bool = False,
    with_rht: bool = False,
    with_random_sign_mask: bool = True,
    stochastic_rounding: bool = False,
    random_bytes_rowwise: torch.Tensor | None = None,
    random_bytes_columnwise: torch.Tensor | None = None,
    use_4over6: bool = False,
    e4m3_max_4over6: float = 256.0,
    err_mode: str = "MAE",
    row_scaled: bool = False,
    amax_rowwise: torch.Tensor | None = None,
    amax_columnwise: torch.Tensor | None = None,
) -> NVFP4QuantizeResult:
    """Quantize a 2D ``(M, K)`` fp32/fp16/bf16 tensor to NVFP4 (rowwise and/or columnwise).

    Each orientation is quantized independently from its source: rowwise from
    ``x``, columnwise from ``xᵀ`` (``(K, M)``), after ``hadamard_transform_16``
    when ``with_rht`` (the RHT applies to columnwise only). Per orientation:

    1. ``A`` = exact NaN-skipping amax of the source (per data row when
       ``row_scaled``: per row of ``x`` / per column of ``x``).
    2. ``S_enc, S_dec = nvfp4_global_scale(A, e4m3_max=E)``; ``E`` = 448, or
       ``e4m3_max_4over6`` under 4over6.
    3. ``b`` = amax of each 1x16 block along the data row (``with_2d_quantization``: of each
       16x16 tile, shared by its 16 rows; columnwise tiles are the transposed
       tiles). Standard: ``s_b = nvfp4_block_scale(b, S_enc)``.
    4. ``enc_b = nvfp4_block_encode_multiplier(s_b, S_dec)``; ``v = RN(x * enc_b)``
       with ``x`` converted exactly to fp32.
    5. ``q = E2M1_RNE_satfinite(v)`` (-0.0 gives code 8, NaN code 7), or with
       ``stochastic_rounding`` ``formats.e2m1_stochastic_round(v, bytes)`` using
       the caller's bytes (uint8, one per element, shaped like the unpacked data:
       ``(M, K)`` rowwise, ``(K, M)`` columnwise).

    4over6: ``s4, s6 = nvfp4_4over6_block_scales(b, S_enc)``; each candidate is
    encoded with RN as in 4-5; its error is accumulated per block in fp32 in
    element order (see ``_4over6_error``); with 2D the 16 row errors of a
    tile are summed in the tree ``(r,r+8) -> (r,r+4) -> (r,r+2) -> (r,r+1)``.
    Map-to-4 is chosen iff ``err4 < err6``; ties go to map-to-6. With 2D the
    columnwise choice is made on the transposed tile, so it can differ from the
    rowwise one.

    ``amax_rowwise`` / ``amax_columnwise``: the ``A`` to use instead of the
    source's own (amax reduction: the maximum over a process group of
    :func:`nvfp4_amax`), shaped as the computed one.

    Requirements (``ValueError`` otherwise): K % 16 == 0; M % 16 == 0 for
    columnwise or 2D; RHT needs bf16; 4over6 excludes SR and RHT; row-scaled
    excludes RHT, 2D and SR; 2D excludes RHT.
    """
    err_mode = err_mode.upper()
    e4m3_max_4over6 = float(e4m3_max_4over6)
    flags = dict(
        rowwise=rowwise,
        columnwise=columnwise,
        with_2d_quantization=with_2d_quantization,
        with_rht=with_rht,
        stochastic_rounding=stochastic_rounding,
        use_4over6=use_4over6,
        e4m3_max_4over6=e4m3_max_4over6,
        err_mode=err_mode,
        row_scaled=row_scaled,
    )
    validate_options(x2d, flags)
    m, k = x2d.shape
    check_random_bytes("random_bytes_rowwise", random_bytes_rowwise, (m, k), stochastic_rounding and rowwise)
    check_random_bytes(
        "random_bytes_columnwise", random_bytes_columnwise, (k, m), stochastic_rounding and columnwise
    )
    e4m3_max = e4m3_max_4over6 if use_4over6 else 448.0
    options = dict(
        tile_rows=BLOCK if with_2d_quantization else 1, use_4over6=use_4over6, e4m3_max=e4m3_max, err_mode=err_mode
    )
    row = [None, None, None]
    if rowwise:
        source = x2d.to(torch.float32).contiguous()
        amax = _global_amax(source, per_row=row_scaled) if amax_rowwise is None else _given_amax(amax_rowwise)
        data, scale = _quantize_2d_orientation(source, amax, random_bytes=random_bytes_rowwise, **options)
        row = [data, _pad_scales(scale), amax]
    col = [None, None, None]
    if columnwise:
        source_t = x2d.t().contiguous()
        if with_rht:
            source_t = hadamard_transform_16(source_t, random_sign_mask=with_random_sign_mask)
        source_t = source_t.to(torch.float32)
        amax = _global_amax(source_t, per_row=row_scaled) if amax_columnwise is None else _given_amax(amax_columnwise)
        data, scale = _quantize_2d_orientation(source_t, amax, random_bytes=random_bytes_columnwise, **options)
        col = [data, _pad_scales(scale), amax]
    return NVFP4QuantizeResult(*row, *col, e4m3_max=e4m3_max)


# -------------------------------------------------------------- dequantize
def dequantize_nvfp4(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    amax: torch.Tensor | float,
    *,
    shape: tuple[int, ...] | torch.Size,
    columnwise: bool = False,
    e4m3_max: float = 448.0,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """Decode NVFP4 data to ``out_dtype`` with TE's dequantize-kernel order.

    ``final_scale = RN(RN(float(s_b) * A) * fl(1/(6*E)))`` per block, then
    ``x̂ = out_dtype(RN(e2m1(q) * final_scale))`` (one fp32 RN, then one cast).
    ``fl(1/(6E))`` is ``1/(6E)`` evaluated in double and rounded once to fp32.
    Only the valid scale region ``[:rows, :cols/16]`` is read.

    ``shape`` is the logical shape of the original tensor (``M`` = product of
    leading dims, ``K`` = last dim). Rowwise: ``data`` is ``(M, K/2)``.
    ``columnwise``: ``data`` is columnwise ``(K, M/2)``; it is decoded as
    ``(K, M)`` and transposed back (an RHT applied before quantization is not
    undone). ``amax`` is a scalar/``(1,)`` or one value per data row
    (row-scaled).
    """
    if len(shape) == 0:
        raise ValueError("dequantize_nvfp4: shape must have at least one dim")
    m, k = rows_cols(int(d) for d in shape)
    rows, cols = (k, m) if columnwise else (m, k)
    if cols % BLOCK != 0 or data.dtype != torch.uint8 or tuple(data.shape) != (rows, cols // 2):
        raise ValueError(
            f"dequantize_nvfp4: expected uint8 data of shape {(rows, cols // 2)} (blocks of {BLOCK}) "
            f"for shape {tuple(shape)} (columnwise={columnwise}), got {data.dtype} {tuple(data.shape)}"
        )
    n_blocks = cols // BLOCK
    if scale_inv.dtype != torch.uint8 or scale_inv.shape[0] < rows or scale_inv.shape[1] < n_blocks:
        raise ValueError(
            f"dequantize_nvfp4: expected uint8 scales covering {(rows, n_blocks)}, "
            f"got {scale_inv.dtype} {tuple(scale_inv.shape)}"
        )
    s_b = E4M3.to_fp32(scale_inv[:rows, :n_blocks].contiguous())
    a = torch.as_tensor(amax, dtype=torch.float32, device=data.device).reshape(-1, 1)
    if a.shape[0] not in (1, rows):
        raise ValueError(f"dequantize_nvfp4: amax must hold 1 or {rows} values, got {a.numel()}")
    final_scale = (s_b * a) * fl(1.0 / (6.0 * e4m3_max), s_b)
    values = e2m1_to_fp32(unpack_e2m1(data)).view(rows, n_blocks, BLOCK) * final_scale[..., None]
    values = values.view(rows, cols)
    if columnwise:
        values = values.t()
    return values.to(out_dtype).reshape(shape)
