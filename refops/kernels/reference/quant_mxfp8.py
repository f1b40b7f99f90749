"""MXFP8 numerics: 1x32 / 32x1 blocks (or 32x32 tiles) with E8M0 scales (``docs/recipes/mxfp8.md#the-arithmetic``).

Per block with amax ``a`` (NaNs skipped):

* ``e = e8m0(RN(a * fl(1/fmax)))``: the exponent of ``a/fmax`` rounded *up* to a
  power of two (saturating at 2^127), built with integer operations;
* ``q = Q_F(x * 2^(127-e))``: the multiply is exact (a power of two);
* the stored scale byte is ``e``; decoding gives ``float(q) * 2^(e-127)``.

Row-wise blocks run along the last dim (K); column-wise blocks run along the
flattened leading dims (M) and the column-wise data is **not** transposed.
Scale tensors are uint8, zero-padded, in the layout of :func:`refops.layouts.mxfp8_scale_shape`.
"""

from __future__ import annotations

import struct

import torch

from ...formats import (
    e8m0_encode_multiplier,
    e8m0_from_fp32,
    e8m0_to_fp32,
)
from ...layouts import MXFP8_BLOCK_SIZE, mxfp8_scale_shape, mxfp8_scale_valid_shape, rows_cols, zero_padded
from .quant_float8 import abs_max, float8_format

__all__ = ["MXFP8_BLOCK_SIZE", "check_mxfp8_shape", "quantize_mxfp8", "dequantize_mxfp8"]

# fl(1/fmax): 1/448 and 1/57344 rounded to fp32.
_INV_FMAX_BITS = {torch.float8_e4m3fn: 0x3B124925, torch.float8_e5m2: 0x37924925}


def check_mxfp8_shape(shape: torch.Size | tuple[int, ...]) -> None:
    """TE's requirement: ``K % 32 == 0`` and ``M % 32 == 0`` (M = product of the leading dims)."""
    m, k = rows_cols(shape)
    if len(shape) < 2 or k % MXFP8_BLOCK_SIZE != 0 or m % MXFP8_BLOCK_SIZE != 0:
        raise ValueError(
            f"MXFP8 quantization needs a tensor of at least 2 dims whose last dim and product of leading dims "
            f"are multiples of {MXFP8_BLOCK_SIZE}; got shape {tuple(shape)} (M={m}, K={k})"
        )


def _scale_bytes(block_amax: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    # A Python float holding the fp32 value exactly: the product is the same fp32 multiply, and no host
    # tensor is copied to the device (which a CUDA graph capture refuses).
    inv_fmax = struct.unpack("<f", struct.pack("<I", _INV_FMAX_BITS[fp8_dtype]))[0]
    return e8m0_from_fp32(block_amax * inv_fmax)


def _quantize_blocks(blocks: torch.Tensor, e: torch.Tensor, fp8_dtype: torch.dtype) -> torch.Tensor:
    """``Q_F(x * 2^(127-e))`` with ``e`` already broadcast against fp32 ``blocks`` (the product is exact)."""
    scaled = blocks * e8m0_encode_multiplier(e)
    return float8_format(fp8_dtype).quantize(scaled, overwrite=True).view(torch.uint8)


def quantize_mxfp8(
    x: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    with_2d_quantization: bool = False,
) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """``KernelBackend.quantize_mxfp8`` (the contract). Both usages are quantized independently from ``x``;
    with ``with_2d_quantization`` each scale tensor repeats its 32x32 tile's byte per row (row-wise) or per
    column (column-wise)."""
    check_mxfp8_shape(x.shape)
    m, k = rows_cols(x.shape)
    b = MXFP8_BLOCK_SIZE
    x2 = x.reshape(m, k).float()  # exact; the multiplies below then run on fp32 alone
    row_shape = mxfp8_scale_shape(x.shape)
    col_shape = mxfp8_scale_shape(x.shape, columnwise=True)
    if with_2d_quantization:
        tiles = x2.reshape(m // b, b, k // b, b)
        e = _scale_bytes(abs_max(tiles, dim=3).amax(dim=1), fp8_dtype)  # (M/32, K/32)
        q = _quantize_blocks(tiles, e[:, None, :, None], fp8_dtype).reshape(x.shape)
        row = (q, zero_padded(e.repeat_interleave(b, dim=0), row_shape))
        col = (q.clone(), zero_padded(e.repeat_interleave(b, dim=1), col_shape))
    else:
        row = col = None
        if rowwise:
            blocks = x2.reshape(m, k // b, b)
            e = _scale_bytes(abs_max(blocks, dim=2), fp8_dtype)  # (M, K/32)
            row = (_quantize_blocks(blocks, e[:, :, None], fp8_dtype).reshape(x.shape), zero_padded(e, row_shape))
        if columnwise:
            blocks = x2.reshape(m // b, b, k)
            e = _scale_bytes(abs_max(blocks, dim=1), fp8_dtype)  # (M/32, K)
            col = (_quantize_blocks(blocks, e[:, None, :], fp8_dtype).reshape(x.shape), zero_padded(e, col_shape))
    row_data, row_scale = row if rowwise else (None, None)
    col_data, col_scale = col if columnwise else (None, None)
    return row_data, row_scale, col_data, col_scale


def dequantize_mxfp8(
    data: torch.Tensor,
    scale_inv: torch.Tensor,
    *,
    fp8_dtype: torch.dtype,
    columnwise: bool,
    out_dtype: torch.dtype,
) -> torch.Tensor:
    """``KernelBackend.dequantize_mxfp8``; ``columnwise`` says which layout ``scale_inv`` has (32x1 blocks, else
    1x32)."""
    m, k = rows_cols(data.shape)
    b = MXFP8_BLOCK_SIZE
    rows, cols = mxfp8_scale_valid_shape(data.shape, columnwise=columnwise)
    scales = e8m0_to_fp32(scale_inv[:rows, :cols]).repeat_interleave(b, dim=0 if columnwise else 1)
    values = float8_format(fp8_dtype).to_fp32(data.reshape(m, k)) * scales
    return values.to(out_dtype).reshape(data.shape)
