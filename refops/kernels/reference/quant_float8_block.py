"""FP8 block scaling numerics: 1x128 and 128x128 blocks with fp32 scales (``docs/recipes/fp8-block.md``).

Per block with amax ``a`` over its in-bounds elements (NaNs skipped):
``s = compute_scale_from_amax(a, fmax, pow2, eps, value_for_inf = max of the
input dtype)``, ``q = Q_F(RN(x * s))``, ``scale_inv = RN(1/s)``.

Layouts (M = product of leading dims, K = last dim; the column-wise data is the
**transpose**, shape ``(K, *lead)``). Scale tensors are "GEMM ready", fp32,
zero-padded (TE leaves padding uninitialized):

=============  ==================================  =====================
case           shape                               element
=============  ==================================  =====================
1D rowwise     (ceil(K/128), round_up(M,4))        [k/128, m]
1D columnwise  (ceil(M/128), round_up(K,4))        [m/128, k]
2D rowwise     (ceil(M/128), round_up(ceil(K/128),4))  [m/128, k/128]
2D columnwise  (ceil(K/128), round_up(ceil(M/128),4))  [k/128, m/128]
=============  ==================================  =====================

In terms of the stored data's own 2-D view ``(R, C)`` both orientations read
alike: 1D ``[c/128, r]``, 2D ``[r/128, c/128]``. 2D column-wise bytes and scales
are the exact transposes of the row-wise ones.
"""

from __future__ import annotations

import torch

from .quant_float8 import abs_max, compute_scale_from_amax, float8_format, reciprocal_rn

__all__ = ["FP8_BLOCK_SIZE", "quantize_float8_block", "dequantize_float8_block"]

FP8_BLOCK_SIZE = 128


def _ceil_div(n: int, d: int) -> int:
    return (n + d - 1) // d


def _round_up(n: int, multiple: int) -> int:
    return _ceil_div(n, multiple) * multiple


def _value_for_inf(dtype: torch.dtype) -> float:
    if dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"FP8 block quantization takes fp32, fp16 or bf16 input, got {dtype}")
    return float(torch.finfo(dtype).max)


def _padded(valid: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    if tuple(valid.shape) == (rows, cols):
        return valid.clone(memory_format=torch.contiguous_format)  # already whole: a copy, no padding
    out = torch.zeros(rows, cols, dtype=torch.float32, device=valid.device)
    out[: valid.shape[0], : valid.shape[1]] = valid
    return out


def _tiles(x2: torch.Tensor, tile_rows: int) -> torch.Tensor:
    """``(R, C)`` viewed as ``(R/tr, tr, C/128, 128)``, zero-padded to whole tiles when it is not already."""
    r, c = x2.shape
    rows, cols = _round_up(r, tile_rows), _round_up(c, FP8_BLOCK_SIZE)
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
    """``(rowwise_data, rowwise_scale_inv, columnwise_data, columnwise_scale_inv)``; None where not asked.

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
    row = col = (None, None)
    if block_scaling_dim == 2:
        q, s = _quantize_tiles(x2, FP8_BLOCK_SIZE, fp8_dtype=fp8_dtype, scale_args=scale_args)
        if rowwise:
            row = (q.reshape(x.shape), _padded(s, s.shape[0], _round_up(s.shape[1], 4)))
        if columnwise:
            col = (q.t().contiguous().reshape(k, *lead), _padded(s.t(), s.shape[1], _round_up(s.shape[0], 4)))
    else:
        if rowwise:
            q, s = _quantize_tiles(x2, 1, fp8_dtype=fp8_dtype, scale_args=scale_args)  # s: (M, ceil(K/128))
            row = (q.reshape(x.shape), _padded(s.t(), s.shape[1], _round_up(m, 4)))
        if columnwise:
            q, s = _quantize_tiles(x2.t(), 1, fp8_dtype=fp8_dtype, scale_args=scale_args)  # s: (K, ceil(M/128))
            col = (q.reshape(k, *lead), _padded(s.t(), s.shape[1], _round_up(k, 4)))
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
    """``RN(float(q) * scale_inv_block)`` in fp32, rounded once to ``out_dtype``; same shape as ``data``.

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
    if block_scaling_dim == 2:
        per_block = scale_inv[: _ceil_div(r, b), : _ceil_div(c, b)]
        scales = per_block.repeat_interleave(b, dim=0)[:r].repeat_interleave(b, dim=1)[:, :c]
    else:
        per_block = scale_inv[: _ceil_div(c, b), :r].t()  # (R, ceil(C/128))
        scales = per_block.repeat_interleave(b, dim=1)[:, :c]
    values = float8_format(fp8_dtype).to_fp32(data2) * scales.float()
    return values.to(out_dtype).reshape(data.shape)
