"""The collectives of tensor parallelism, under the name ``docs/tensor-parallel.md`` documented before they moved
below the ops that use them (:mod:`refops.ops.collectives`, :mod:`refops.ops.tensor_parallel_gather`)."""

from __future__ import annotations

from ..ops.collectives import (
    all_reduce,
    check_process_group,
    check_same_shape_across_ranks,
    get_group_size,
    reduce_scatter_along_first_dim,
)
from ..ops.tensor_parallel_gather import gather_along_first_dim

__all__ = [
    "all_reduce",
    "check_process_group",
    "check_same_shape_across_ranks",
    "gather_along_first_dim",
    "get_group_size",
    "reduce_scatter_along_first_dim",
]
