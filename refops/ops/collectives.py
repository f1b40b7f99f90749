"""The collectives tensor parallelism uses, each a thin named step over ``torch.distributed``.

* :func:`all_gather_rows` / :func:`all_gather_columns`: concatenate the ranks' plain tensors along dim 0 /
  dim 1, in rank order (a quantized one is gathered by
  :func:`refops.ops.tensor_parallel_gather.gather_along_first_dim`);
* :func:`reduce_scatter_along_first_dim`: sum over the ranks, then rank ``r`` keeps the ``r``-th
  slice along dim 0 (high precision only, as in TE);
* :func:`all_reduce`: sum over the ranks (high precision only, as in TE);
* :func:`get_group_size`, :func:`check_process_group`, :func:`check_same_shape_across_ranks`: the checks
  that name a wrong argument where it is given, not deep inside a backend.

A group of one rank (or no initialized process group) makes each step the identity. Every
communication goes through ``torch.distributed`` (gloo on the CPU, NCCL on GPUs); nothing is
home-made. torch 2.13 renames ``all_gather_into_tensor`` / ``reduce_scatter_tensor`` to
``all_gather_single`` / ``reduce_scatter_single``; whichever exists is used, so older torch
versions work and newer ones do not warn. ``refops.distributed.collectives`` re-exports these names.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from ..quantization.quantized_tensor import QuantizedTensor

__all__ = [
    "all_gather_columns",
    "all_gather_rows",
    "all_reduce",
    "check_process_group",
    "check_same_shape_across_ranks",
    "get_group_size",
    "reduce_scatter_along_first_dim",
]

_all_gather_into = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_into = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def check_process_group(group: Any, *, owner: str = "refops") -> None:
    """Raise a ``TypeError`` naming ``owner`` unless ``group`` is None (the default group) or a ``ProcessGroup``.

    Checked whether or not a process group is initialized, so a wrong argument (the string ``"WORLD"``, a
    rank list, a ``DeviceMesh``) is caught where it is given, not deep inside a collective later.
    """
    if group is None or (dist.is_available() and isinstance(group, dist.ProcessGroup)):
        return
    hint = " (pass torch.distributed.group.WORLD or None for the default group)" if isinstance(group, str) else ""
    if type(group).__name__ == "DeviceMesh":
        hint = " (pass mesh.get_group() for a DeviceMesh)"
    raise TypeError(
        f"{owner}: expected a torch.distributed ProcessGroup or None (the default group), got "
        f"{type(group).__name__} {group!r}{hint}"
    )


def get_group_size(group: Any = None, *, owner: str = "refops") -> int:
    """Ranks in ``group`` (the default group for None); 1 when ``torch.distributed`` is not initialized.

    ``owner`` (e.g. ``"BasicLinear: tensor_parallel_group"``) names the argument in the error for a
    ``group`` that is not a process group (:func:`check_process_group`).
    """
    check_process_group(group, owner=owner)
    if not (dist.is_available() and dist.is_initialized()):
        return 1
    return dist.get_world_size(group)


#: Dims a shape descriptor holds; a tensor with more folds the rest into the last entry.
_SHAPE_SLOTS = 8


def check_same_shape_across_ranks(tensor: torch.Tensor, group: Any = None, *, what: str) -> None:
    """Raise ``ValueError`` on every rank, naming ``what`` and each rank's shape, unless all ranks of ``group``
    pass ``tensor``s of one shape.

    The collectives need equal shapes; without this check a mismatch fails inside the backend (gloo,
    NCCL) with an error that names neither the tensor nor the shapes, or hangs. One small all-gather
    of each rank's shape (every rank of the group must call it, in the same order as the collective).
    """
    world = get_group_size(group)
    if world == 1:
        return
    shape = list(tensor.shape)
    head, rest = shape[: _SHAPE_SLOTS - 1], shape[_SHAPE_SLOTS - 1 :]
    slots = head + [-1] * (_SHAPE_SLOTS - 1 - len(head)) + [math.prod(rest) if rest else -1]
    descriptor = torch.tensor([len(shape), *slots], dtype=torch.int64, device=tensor.device)
    everyone = torch.empty(world * descriptor.numel(), dtype=torch.int64, device=tensor.device)
    _all_gather_into(everyone, descriptor, group=group)
    rows = everyone.reshape(world, -1)
    if bool((rows == rows[:1]).all()):
        return
    described = []
    for rank, row in enumerate(rows.tolist()):
        ndim, dims = row[0], row[1:]
        dims = dims[:ndim] if ndim < _SHAPE_SLOTS else dims[: _SHAPE_SLOTS - 1] + [f"... ({dims[-1]} more elements)"]
        described.append(f"rank {rank}: {tuple(dims)}")
    raise ValueError(f"{what}: every rank of the group must pass the same shape, got {', '.join(described)}")


def all_gather_rows(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Plain tensors: ``torch.cat`` over the ranks along dim 0 (rank order); dtype and trailing dims kept."""
    tensor = tensor.contiguous()
    world = get_group_size(group)
    out = torch.empty((world * tensor.shape[0], *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    _all_gather_into(out, tensor, group=group)
    return out


def all_gather_columns(tensor: torch.Tensor, group: Any) -> torch.Tensor:
    """Plain 2-D ``(R, C)`` tensors: ``torch.cat`` over the ranks along dim 1 (transposed data's rows)."""
    world = get_group_size(group)
    stacked = all_gather_rows(tensor.contiguous().unsqueeze(0), group)  # (world, R, C)
    return stacked.permute(1, 0, 2).reshape(tensor.shape[0], world * tensor.shape[1])


def _check_divisible(op_name: str, tensor: torch.Tensor, world: int) -> None:
    if tensor.dim() == 0 or tensor.shape[0] % world:
        raise ValueError(
            f"{op_name}: reduce-scatter along dim 0 needs a size divisible by the group size {world}; "
            f"got shape {tuple(tensor.shape)}"
        )


def reduce_scatter_along_first_dim(tensor: torch.Tensor, group: Any = None, *, op_name: str = "reduce_scatter"
                                   ) -> torch.Tensor:
    """Sum over the ranks, then keep this rank's slice of dim 0 (size ``shape[0] / world``).

    A quantized tensor is dequantized first (TE reduces in high precision). Raises
    ``ValueError`` (naming ``op_name``) when dim 0 is not divisible by the group size.
    """
    if isinstance(tensor, QuantizedTensor):
        tensor = tensor.dequantize()
    world = get_group_size(group)
    if world == 1:
        return tensor
    _check_divisible(op_name, tensor, world)
    tensor = tensor.contiguous()
    out = torch.empty((tensor.shape[0] // world, *tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
    _reduce_scatter_into(out, tensor, group=group)
    return out


def all_reduce(tensor: torch.Tensor, group: Any = None) -> torch.Tensor:
    """Sum over the ranks, every rank gets the sum (a quantized tensor is dequantized first).

    The result is a new tensor: the caller's tensor is never modified.
    """
    if isinstance(tensor, QuantizedTensor):
        tensor = tensor.dequantize()
    if get_group_size(group) == 1:
        return tensor
    out = tensor.clone(memory_format=torch.contiguous_format)
    dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out
