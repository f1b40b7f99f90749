"""The cuBLAS 128x4 block-scale swizzle of MXFP8 and NVFP4 scale tensors."""

from __future__ import annotations

import torch

__all__ = ["swizzle_block_scales", "unswizzle_block_scales"]


def _check_swizzle_shape(scales: torch.Tensor, name: str) -> None:
    if scales.ndim != 2 or scales.shape[0] % 128 != 0 or scales.shape[1] % 4 != 0:
        raise ValueError(f"{name}: expected a 2D scale tensor padded to (128k, 4j), got {tuple(scales.shape)}")


def swizzle_block_scales(scales: torch.Tensor) -> torch.Tensor:
    """cuBLAS 128x4 block-scale swizzle, returned with the same ``(R, C)`` shape.

    ``S[128*rb + 32*i + j, 4*cb + l]`` goes to linear offset
    ``((rb*(C/4) + cb)*32 + j)*16 + 4*i + l``: reshape to ``(R/128, 4, 32, C/4, 4)``,
    permute ``(0, 3, 2, 1, 4)``, flatten. NVFP4 columnwise scales are already
    stored transposed, so the same swizzle applies to them (``docs/recipes/index.md#the-cublas-scale-swizzle``).
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
