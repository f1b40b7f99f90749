"""The one quantized all-gather along dim 0, which FSDP2 and tensor parallelism both use.

What travels for a shard (:func:`gather_inputs`): its row-major arrays for the usages asked (data and
scales without padding or transposition, dim 0 over its rows; :mod:`refops.sharding.row_major`), never a
dequantized copy; then each whole-tensor array (per-tensor FP8's ``scale_inv``, NVFP4's global amaxes) as
one row per rank, so that the receiver can check every rank's agree. The gathered arrays rebuild the whole
(:func:`assemble`): bit for bit the tensor that quantizing the gathered high-precision tensor gives,
provided the shards share their whole-tensor scales (their amax reduced over the group).

Who moves the inputs is the caller's: tensor parallelism all-gathers them itself
(:func:`all_gather_quantized`, installed as ``refops.ops.tensor_parallel_gather``'s quantized gather),
FSDP2 all-gathers what ``fsdp_pre_all_gather`` returns and hands the outputs to ``fsdp_post_all_gather``
(:mod:`refops.sharding.fsdp2_all_gather`).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from ..ops.collectives import all_gather_rows, get_group_size
from ..ops.tensor_parallel_gather import install_quantized_gather
from ..quantization.quantized_tensor import QuantizedTensor
from ..layouts import dim0_rows_cols as rows_cols
from .row_major import from_row_major, row_arrays, shared_arrays, to_row_major

__all__ = ["GatherPlan", "gather_inputs", "first_disagreement", "assemble", "all_gather_quantized"]


@dataclasses.dataclass(frozen=True)
class GatherPlan:
    """What a shard's gather inputs are: ``arrays`` (row-major, in order), then ``shared`` (one row per rank),
    and the ``usages`` the gathered tensor holds."""

    arrays: tuple[str, ...]
    shared: tuple[str, ...]
    usages: tuple[str, ...]


def gather_inputs(shard: QuantizedTensor, usages: tuple[str, ...], *, what: str
                  ) -> tuple[GatherPlan, tuple[torch.Tensor, ...]]:
    """The plan and the tensors to all-gather (each along dim 0) for ``shard``, to rebuild a tensor with ``usages``.

    Raises ``ValueError`` naming ``what`` when a row-major array of ``shard`` would cover a partial block of rows
    (its rows then have no whole row-major rows to concatenate).
    """
    specs = row_arrays(shard, usages)
    rows, _ = rows_cols(shard.shape)
    partial = [kw for kw, spec in specs.items() if rows % spec.granularity]
    if partial:
        raise ValueError(
            f"{what}: a {type(shard).__name__} shard of shape {tuple(shard.shape)} does not quantize to whole blocks "
            "along dim 0, so it cannot be gathered in quantized form; gather the high-precision tensor "
            "(gather_along_first_dim(x, group, quantizer=q)) instead"
        )
    arrays = {kw: a for kw, a in to_row_major(shard, what=what).items() if kw in specs}
    shared = shared_arrays(shard, usages)
    plan = GatherPlan(tuple(arrays), tuple(shared), usages)
    return plan, (*arrays.values(), *(value.reshape(1, -1) for value in shared.values()))


def first_disagreement(plan: GatherPlan, outputs: tuple[torch.Tensor, ...]) -> Optional[tuple[str, torch.Tensor]]:
    """The first whole-tensor array whose gathered rows (one per rank) are not all equal, with those rows."""
    for kw, gathered in zip(plan.shared, outputs[len(plan.arrays):]):
        if not bool((gathered == gathered[:1]).all()):
            return kw, gathered
    return None


def assemble(template: QuantizedTensor, plan: GatherPlan, outputs: tuple[torch.Tensor, ...], *,
             shape: torch.Size, shared: dict[str, torch.Tensor]) -> QuantizedTensor:
    """The gathered tensor of nominal ``shape`` from the gathered row-major ``outputs`` and the agreed ``shared``
    arrays; ``template`` (a shard) gives the class, format, dtype and quantizer."""
    arrays = dict(zip(plan.arrays, outputs))
    return from_row_major(template, arrays, torch.Size(shape), shared, usages=plan.usages)


def all_gather_quantized(shard: QuantizedTensor, group: object, *, usages: tuple[str, ...], what: str,
                         disagreement: Callable[[str, torch.Tensor], Exception]) -> QuantizedTensor:
    """Every rank's ``shard`` concatenated along dim 0 (rank order), quantized, with ``usages``.

    Raises ``disagreement(kw, rows)`` on every rank when the ranks' whole-tensor array ``kw`` differ.
    The gathered tensor shares this rank's whole-tensor arrays (equal on every rank, checked).
    """
    plan, inputs = gather_inputs(shard, usages, what=what)
    outputs = tuple(all_gather_rows(t, group) for t in inputs)
    bad = first_disagreement(plan, outputs)
    if bad is not None:
        raise disagreement(*bad)
    shape = torch.Size((get_group_size(group) * shard.shape[0], *shard.shape[1:]))
    return assemble(shard, plan, outputs, shape=shape, shared=shared_arrays(shard, usages))


install_quantized_gather(all_gather_quantized)
