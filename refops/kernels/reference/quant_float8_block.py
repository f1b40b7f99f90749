"""FP8 block scaling numerics: 1x128 and 128x128 blocks with fp32 scales (``docs/recipes/fp8-block.md``).

Per block with amax ``a`` over its in-bounds elements (NaNs skipped):
``s = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf = max of the
input dtype)``, ``q = Q_F(RN(x * s))``, ``scale_inv = RN(1/s)``.

Layouts (M = product of leading dims, K = last dim): the column-wise data is the
**transpose**, shape ``(K, *lead)``; scale tensors are "GEMM ready", fp32,
zero-padded, as :mod:`refops.layouts` tabulates them
(:func:`refops.layouts.float8_block_scale_shape`). 2D column-wise bytes and scales
are the exact transposes of the row-wise ones.
"""

from __future__ import annotations

import torch

from ...layouts import (
    FP8_BLOCK_SIZE,
    columnwise_layout,
    float8_block_scale_shape,
    float8_block_scale_valid_shape,
    round_up,
    zero_padded,
)
from .quant_float8 import abs_max, compute_scale_from_amax, float8_format, reciprocal_rn

__all__ = ["FP8_BLOCK_SIZE", "quantize_float8_block", "dequantize_float8_block"]


def _value_for_inf(dtype: torch.dtype) -> float:
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"FP8 block quantization takes fp32, fp16 or bf16 input, got {dtype}")
    return float(torch.finfo(dtype).max)


def _tiles(x2: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """``(R, C)`` viewed as ``(R/tr, tr, C/128, 128)``, zero-padded to whole tiles when it is not already."""
    r, c = x2.shape
    rows, cols = round_up(r, tile_rows), round_up(c, FP8_BLOCK_SIZE)
    if (rows, cols) != (r, c) or not x2.is_contiguous():
        padded = torch.zeros(rows, cols, dtype=x2.dtype, device=x2.device)
        padded[:r, :c] = x2
        x2 = padded
    return x2.view(rows // tile_rows, tile_rows, cols // FP8_BLOCK_SIZE, FP8_BLOCK_SIZE)


def _quantize_tiles(
    x2: torch.Tensor, tile_rows: int, *, fp8_dtype: torch.dtype, scale_args: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q (R, C) uint8, scale_inv (R/tile_rows, C/128) fp32)`` of one orientation (``x2`` fp32)."""
    r, c = x2.shape
    tiles = _tiles(x2, tile_rows)
    block_amax = abs_max(tiles, dim=3)  # per row of each tile
    if tile_rows > 1:
        block_amax = block_amax.amax(dim=1)
    else:
        block_amax = block_amax.squeeze(1)
    scale = compute_scale_from_amax(block_amax, **scale_args)
    scaled = tiles * scale[:, None, :, None]
    q = float8_format(fp8_dtype).quantize(scaled, overwrite=True).view(torch.uint8)
    q = q.reshape(tiles.shape[0] * tile_rows, tiles.shape[2] * FP8_BLOCK_SIZE)[:r, :c].contiguous()
    return q, reciprocal_rn(scale)


def quantize_float8_block(
    x: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    block_scaling_dim: int,
    force_pow_2_scales: bool,
    amax_epsilon: float,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``KernelBackend.quantize_float8_block`` (the contract).

    1D: each orientation is quantized separately from ``x`` (1x128 along K
    row-wise, along M column-wise). 2D: one quantization; column-wise is its transpose.
    """
    if block_scaling_dim not in (1, 2):
        raise ValueError(f"block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
    k = x.shape[-1] if x.dim() > 0 else 1
    lead = tuple(x.shape[:-1])
    x2 = x.reshape(-1, k).float()  # exact; the multiplies below then run on fp32 alone
    m = x2.shape[0]
    scale_args = dict(
        fmax=float8_format(fp8_dtype).max,
        force_pow_2_scales=force_pow_2_scales,
        amax_epsilon=amax_epsilon,
        value_for_inf=_value_for_inf(x.dtype),
    )
    layout = dict(block_scaling_dim=block_scaling_dim)
    row_shape = float8_block_scale_shape((m, k), **layout)
    col_shape = float8_block_scale_shape((m, k), columnwise=True, **layout)
    row = col = (None, None)
    if block_scaling_dim == 2:
        q, s = _quantize_tiles(x2, FP8_BLOCK_SIZE, fp8_dtype=fp8_dtype, scale_args=scale_args)
        if rowwise:
            row = (q.reshape(x.shape), zero_padded(s, row_shape))
        if columnwise:
            col = (columnwise_layout(q).reshape(k, *lead), zero_padded(s.t(), col_shape))
    else:
        if rowwise:
            q, s = _quantize_tiles(x2, 1, fp8_dtype=fp8_dtype, scale_args=scale_args)  # s: (M, ceil(K/128))
            row = (q.reshape(x.shape), zero_padded(s.t(), row_shape))
        if columnwise:
            q, s = _quantize_tiles(x2.t(), 1, fp8_dtype=fp8_dtype, scale_args=scale_args)  # s: (K, ceil(M/128))
            col = (q.reshape(k, *lead), zero_padded(s.t(), col_shape))
    return row[0], row[1], col[0], col[1]


def dequantize_float8_block(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    columnwise: bool,
    block_scaling_dim: int,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``KernelBackend.dequantize_float8_block``: ``RN(float(q) * scale_inv_block)`` in fp32, one rounding.

    ``data`` is stored row-wise ``(*lead, K)`` (2-D view ``(M, K)``) or column-wise
    ``(K, *lead)`` (2-D view ``(K, M)``).
    """
    if columnwise:
        r = data.shape[0]
        data2 = data.reshape(r, -1)
    else:
        data2 = data.reshape(-1, data.shape[-1])
    r, c = data2.shape
    b = FP8_BLOCK_SIZE
    # Both orientations read alike in terms of the stored data's own 2-D view (R, C): its row-wise layout.
    valid_rows, valid_cols = float8_block_scale_valid_shape((r, c), block_scaling_dim=block_scaling_dim)
    if block_scaling_dim == 2:
        per_block = scale_inv[:valid_rows, :valid_cols]
        scales = per_block.repeat_interleave(b, dim=0)[:r].repeat_interleave(b, dim=1)[:, :c]
    else:
        per_block = scale_inv[:valid_rows, :valid_cols].t()  # (R, ceil(C/128))
        scales = per_block.repeat_interleave(b, dim=1)[:, :c]
    values = float8_format(fp8_dtype).to_fp32(data2) * scales.float()
    return values.to(out_dtype).reshape(data.shape)
