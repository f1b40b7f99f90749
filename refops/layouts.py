"""Layouts: where a quantized tensor's bytes and scales live, and the shape of every array with its padding.

The one home of what TransformerEngine's kernels and cuBLAS fix about memory; the quantizers, the kernels
(reference and fast path), the sharding code and the oracle read their shapes here. ``M`` is the product of a
tensor's leading dims and ``K`` its last dim: :func:`rows_cols` gives the tensor's row-major form ``(M, K)``.

* Per-tensor FP8: row-wise bytes of ``x``'s shape; the column-wise copy is their transpose, shape
  ``(K, *lead)`` (:func:`columnwise_layout`); one fp32 ``scale_inv`` of shape ``(1,)``.
* MXFP8 (blocks of :data:`MXFP8_BLOCK_SIZE`): both usages keep ``x``'s shape (the column-wise data is **not**
  transposed); E8M0 scale bytes zero-padded to cuBLAS's 128x4 scale tiles: row-wise
  ``(round_up(M,128), round_up(K/32,4))`` holding ``[m, k/32]``, column-wise ``(round_up(M/32,4),
  round_up(K,128))`` holding ``[m/32, k]``.
* NVFP4 (blocks of :data:`NVFP4_BLOCK_SIZE`): E2M1 codes two a byte; row-wise data ``(*lead, K/2)``,
  column-wise the transpose ``(K, M/2)``; E4M3 scale bytes of each orientation's own 2-D view ``(R, C)``
  zero-padded to 128x4 tiles: ``(round_up(R,128), round_up(ceil(C/16),4))`` holding ``[r, c/16]``.
* FP8 block scaling (blocks of :data:`FP8_BLOCK_SIZE`): column-wise data transposed, ``(K, *lead)``; fp32
  scales in TE's "GEMM-ready" layout, the second dim zero-padded to a multiple of 4 (table below, in terms of
  the nominal ``(M, K)``; in terms of the stored data's own 2-D view ``(R, C)`` both orientations read alike:
  1x128 blocks ``[c/128, r]``, 128x128 tiles ``[r/128, c/128]``).

=============  =========================================  =====================
case           padded shape                               element
=============  =========================================  =====================
1D rowwise     (ceil(K/128), round_up(M,4))               [k/128, m]
1D columnwise  (ceil(M/128), round_up(K,4))               [m/128, k]
2D rowwise     (ceil(M/128), round_up(ceil(K/128),4))     [m/128, k/128]
2D columnwise  (ceil(K/128), round_up(ceil(M/128),4))     [k/128, m/128]
=============  =========================================  =====================

Padding is zero-filled here (TE leaves it uninitialized): only the valid region (``*_scale_valid_shape``)
carries meaning. The cuBLAS 128x4 swizzle of MXFP8 and NVFP4 scales (:func:`swizzle_block_scales`) is the
layout Blackwell GEMMs read (``docs/recipes/index.md#the-cublas-scale-swizzle``); refops stores the compact
layout above.
"""

from __future__ import annotations

import math
from typing import Iterable

import torch

__all__ = [
    "ceil_div",
    "round_up",
    "rows_cols",
    "dim0_rows_cols",
    "columnwise_shape",
    "columnwise_layout",
    "rowwise_layout",
    "zero_padded",
    "SCALE_TILE",
    "scale_tile_padded",
    "MXFP8_BLOCK_SIZE",
    "mxfp8_scale_valid_shape",
    "mxfp8_scale_shape",
    "NVFP4_BLOCK_SIZE",
    "nvfp4_data_shape",
    "nvfp4_scale_valid_shape",
    "nvfp4_scale_shape",
    "FP8_BLOCK_SIZE",
    "float8_block_scale_valid_shape",
    "float8_block_scale_shape",
    "swizzle_block_scales",
    "unswizzle_block_scales",
]

Shape = Iterable[int]

#: Elements per MXFP8 block (1x32 row-wise, 32x1 column-wise, 32x32 tiles in 2D).
MXFP8_BLOCK_SIZE = 32
#: Elements per NVFP4 block (1x16, and the side of a 16x16 tile in 2D).
NVFP4_BLOCK_SIZE = 16
#: Elements per FP8 block-scaling block (1x128) and the side of its 128x128 tiles.
FP8_BLOCK_SIZE = 128
#: cuBLAS reads MXFP8 and NVFP4 scales in tiles of 128 rows x 4 columns (the swizzle's unit), so they are
#: allocated in whole tiles.
SCALE_TILE = (128, 4)


# ------------------------------------------------------------------ integers
def ceil_div(n: int, d: int) -> int:
    """``ceil(n / d)`` for ``d > 0``, in integers."""
    return -(-n // d)


def round_up(n: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` (``> 0``) that is ``>= n``."""
    return ceil_div(n, multiple) * multiple


# ----------------------------------------------------------- row-major form
def rows_cols(shape: Shape) -> tuple[int, int]:
    """``(M, K)``: the product of the leading dims and the last dim; ``(1, 1)`` for a 0-dim shape.

    Every recipe quantizes a tensor as this 2-D view: blocks run along ``K`` row-wise and along ``M``
    column-wise.
    """
    shape = tuple(shape)
    return math.prod(shape[:-1]), (shape[-1] if shape else 1)


def dim0_rows_cols(shape: Shape) -> tuple[int, int]:
    """``(rows, cols)`` of the view a dim-0 cut or gather works on: :func:`rows_cols`, except that a 1-D tensor
    is a column (its elements are its rows, as a dim-0 gather concatenates them)."""
    shape = tuple(shape)
    if len(shape) == 1:
        return shape[0], 1
    return rows_cols(shape)


def columnwise_shape(shape: Shape) -> tuple[int, ...]:
    """``(K, *lead)``: the shape of a transposed column-wise copy (``()`` for a 0-dim shape)."""
    shape = tuple(shape)
    return (shape[-1], *shape[:-1]) if shape else ()


def columnwise_layout(data: torch.Tensor) -> torch.Tensor:
    """The column-wise (Hopper, "transposed") copy of row-wise bytes: ``(M, K)`` transposed, shape ``(K, *lead)``.

    Contiguous; where the transpose is the same memory (a single row, or a single column) torch's
    ``contiguous`` returns a view, so the copy shares ``data``'s storage. A 0-dim tensor is cloned.
    """
    if data.dim() == 0:
        return data.clone()
    k = data.shape[-1]
    return data.reshape(-1, k).t().contiguous().reshape(k, *data.shape[:-1])


def rowwise_layout(columnwise: torch.Tensor, shape: Shape) -> torch.Tensor:
    """Inverse of :func:`columnwise_layout`: the row-wise form, of nominal ``shape``, of a transposed copy
    (contiguous; a view of it where that is the same memory, as there)."""
    shape = tuple(shape)
    if not shape:
        return columnwise.clone()
    m, k = rows_cols(shape)
    return columnwise.reshape(k, m).t().contiguous().reshape(shape)


def zero_padded(valid: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """A new contiguous 2-D tensor of ``shape`` with ``valid`` in its top-left corner and zeros elsewhere."""
    if tuple(valid.shape) == tuple(shape):
        return valid.clone(memory_format=torch.contiguous_format)  # already whole: a copy, no padding
    out = torch.zeros(shape, dtype=valid.dtype, device=valid.device)
    out[: valid.shape[0], : valid.shape[1]] = valid
    return out


def scale_tile_padded(rows: int, cols: int) -> tuple[int, int]:
    """``(round_up(rows, 128), round_up(cols, 4))``: a scale array of ``rows x cols`` in whole cuBLAS tiles."""
    return round_up(rows, SCALE_TILE[0]), round_up(cols, SCALE_TILE[1])


# --------------------------------------------------------------------- MXFP8
def mxfp8_scale_valid_shape(shape: Shape, *, columnwise: bool = False) -> tuple[int, int]:
    """MXFP8 scales that carry meaning: row-wise ``(M, K/32)``, column-wise ``(M/32, K)`` (blocks of whole 32s)."""
    m, k = rows_cols(shape)
    return (m // MXFP8_BLOCK_SIZE, k) if columnwise else (m, k // MXFP8_BLOCK_SIZE)


def mxfp8_scale_shape(shape: Shape, *, columnwise: bool = False) -> tuple[int, int]:
    """MXFP8's padded scale shape: row-wise ``(round_up(M,128), round_up(K/32,4))``; column-wise (its blocks run
    down the rows, the scales are not transposed) the tile turned: ``(round_up(M/32,4), round_up(K,128))``."""
    rows, cols = mxfp8_scale_valid_shape(shape, columnwise=columnwise)
    if columnwise:
        return round_up(rows, SCALE_TILE[1]), round_up(cols, SCALE_TILE[0])
    return scale_tile_padded(rows, cols)


# --------------------------------------------------------------------- NVFP4
def nvfp4_data_shape(shape: Shape, *, columnwise: bool = False) -> tuple[int, ...]:
    """Packed NVFP4 bytes (two codes a byte along the blocked dim): row-wise ``(*lead, K/2)``, column-wise the
    transpose ``(K, M/2)``."""
    shape = tuple(shape)
    m, k = rows_cols(shape)
    return (k, m // 2) if columnwise else (*shape[:-1], k // 2)


def nvfp4_scale_valid_shape(shape: Shape, *, columnwise: bool = False) -> tuple[int, int]:
    """NVFP4 scales that carry meaning: row-wise ``(M, ceil(K/16))``, column-wise ``(K, ceil(M/16))``.

    Each orientation's scales follow its own data, ``(M, K)`` or the transposed ``(K, M)``, blocked along the
    last dim; so the column-wise scales of ``shape`` are the row-wise scales of ``(K, M)``.
    """
    m, k = rows_cols(shape)
    rows, cols = (k, m) if columnwise else (m, k)
    return rows, ceil_div(cols, NVFP4_BLOCK_SIZE)


def nvfp4_scale_shape(shape: Shape, *, columnwise: bool = False) -> tuple[int, int]:
    """NVFP4's padded scale shape, whole 128x4 tiles: row-wise ``(round_up(M,128), round_up(ceil(K/16),4))``,
    column-wise ``(round_up(K,128), round_up(ceil(M/16),4))``."""
    return scale_tile_padded(*nvfp4_scale_valid_shape(shape, columnwise=columnwise))


# --------------------------------------------------------- FP8 block scaling
def float8_block_scale_valid_shape(shape: Shape, *, columnwise: bool = False,
                                   block_scaling_dim: int) -> tuple[int, int]:
    """FP8 block scales that carry meaning (module table, unpadded): 1D row-wise ``(ceil(K/128), M)``, column-wise
    ``(ceil(M/128), K)``; 2D row-wise ``(ceil(M/128), ceil(K/128))``, column-wise its transpose."""
    if block_scaling_dim not in (1, 2):
        raise ValueError(f"block_scaling_dim must be 1 or 2, got {block_scaling_dim}")
    m, k = rows_cols(shape)
    mb, kb = ceil_div(m, FP8_BLOCK_SIZE), ceil_div(k, FP8_BLOCK_SIZE)
    if block_scaling_dim == 2:
        return (kb, mb) if columnwise else (mb, kb)
    return (mb, k) if columnwise else (kb, m)


def float8_block_scale_shape(shape: Shape, *, columnwise: bool = False, block_scaling_dim: int) -> tuple[int, int]:
    """FP8 block scaling's GEMM-ready scale shape (TE's ``get_scale_shape``): the valid shape with its second dim
    rounded up to a multiple of 4."""
    rows, cols = float8_block_scale_valid_shape(shape, columnwise=columnwise, block_scaling_dim=block_scaling_dim)
    return rows, round_up(cols, 4)


# ------------------------------------------------------------------- swizzle
def _check_swizzle_shape(scales: torch.Tensor, name: str) -> None:
    rows, cols = SCALE_TILE
    if scales.ndim != 2 or scales.shape[0] % rows != 0 or scales.shape[1] % cols != 0:
        raise ValueError(f"{name}: expected a 2D scale tensor padded to (128k, 4j), got {tuple(scales.shape)}")


def swizzle_block_scales(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS 128x4 block-scale swizzle (``docs/recipes/index.md#the-cublas-scale-swizzle``), returned with the
    same ``(R, C)`` shape.

    ``S[128*rb + 32*i + j, 4*cb + l]`` goes to linear offset
    ``((rb*(C/4) + cb)*32 + j)*16 + 4*i + l``: reshape to ``(R/128, 4, 32, C/4, 4)``,
    permute ``(0, 3, 2, 1, 4)``, flatten. NVFP4 columnwise scales are already
    stored transposed, so the same swizzle applies to them.
    """
    _check_swizzle_shape(scales, "swizzle_block_scales")
    r, c = scales.shape
    tiles = scales.reshape(r // 128, 4, 32, c // 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(r, c)


def unswizzle_block_scales(swizzled: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`swizzle_block_scales`."""
    _check_swizzle_shape(swizzled, "unswizzle_block_scales")
    r, c = swizzled.shape
    tiles = swizzled.reshape(r // 128, c // 4, 32, 4, 4).permute(0, 3, 2, 1, 4)
    return tiles.reshape(r, c)
