"""The layout arithmetic the sharding layer needs, in one private place (to become ``refops.layouts``'s).

Padded scale shapes are restated here only as ``_padded`` targets; every function is exact integer or
copying arithmetic, with no knowledge of a scheme.
"""

from __future__ import annotations

import math

import torch

__all__ = ["ceil_div", "round_up", "rows_cols", "padded", "transposed"]


def ceil_div(n: int, d: int) -> int:
    return -(-n // d)


def round_up(n: int, m: int) -> int:
    return ceil_div(n, m) * m


def rows_cols(shape: torch.Size) -> tuple[int, int]:
    """``(rows, last dim)`` of the 2-D view the scaling schemes block: the leading dims flatten into rows, and a
    1-D tensor is a column (its elements are its rows, as a dim-0 gather concatenates them)."""
    if len(shape) == 1:
        return shape[0], 1
    return math.prod(shape[:-1]), shape[-1]


def padded(valid: torch.Tensor, shape: tuple[int, int]) -> torch.Tensor:
    """``valid`` in the top-left corner of a zero array of ``shape`` (the scale layouts pad with zeros)."""
    if tuple(valid.shape) == tuple(shape):
        return valid.contiguous()
    out = valid.new_zeros(shape)
    out[: valid.shape[0], : valid.shape[1]] = valid
    return out


def transposed(a: torch.Tensor) -> torch.Tensor:
    """A contiguous transposed copy of 2-D ``a``."""
    return a.t().contiguous()
