"""FSDP2's all-gather extension for quantized weights: shards stay quantized, the gather moves bytes.

FSDP2 (``torch.distributed.fsdp.fully_shard``) asks a sharded parameter's local tensor for
``fsdp_pre_all_gather`` (what to all-gather) and ``fsdp_post_all_gather`` (how to rebuild the unsharded
parameter). ``QuantizedTensor`` forwards both to the functions here (importing this module installs them
in :data:`refops.quantization.quantized_tensor.FSDP2_ALL_GATHER`), which use the one quantized gather's
inputs and assembly (:mod:`refops.sharding.quantized_gather`):

* **pre**: the shard's row-major arrays and whole-tensor scales. The scales must agree across the shard
  group, so the shard's quantizer is set to reduce its amax over that group (per-tensor current scaling,
  NVFP4) before anything re-quantizes it (the optimizer step writes into the shard, which re-quantizes it
  in place);
* **post**: the unsharded tensor from the gathered arrays, after checking that every rank's whole-tensor
  scales are equal: bit for bit the tensor that quantizing the gathered high-precision weight gives.

On a mesh of one rank FSDP2 copies only the first all-gather input (its world-size-1 shortcut), so there the
shard travels as a single tensor, its row blocks (:mod:`refops.sharding.row_blocks`).

A shard that cannot be kept quantized (uneven sharding, shard rows not a multiple of the scaling block) is
an error at the first forward, never a silent dequantization; so are shards whose whole-tensor scales
disagree (delayed scaling with ``reduce_amax=False``, or reduced over another group), checked at every gather.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..quantization.float8 import Float8CurrentScalingQuantizer
from ..quantization.nvfp4 import NVFP4Quantizer
from ..quantization.quantized_tensor import FSDP2_ALL_GATHER, QuantizedTensor
from .quantized_gather import GatherPlan, assemble, first_disagreement, gather_inputs
from .row_blocks import decode_row_blocks, encode_row_blocks
from .row_major import block_rows, cuttable, usages_of

__all__ = ["pre_all_gather", "post_all_gather", "reduce_amax_over"]

#: Metadata tag of a one-rank mesh's single all-gather input (the shard's row blocks).
_ONE_TENSOR = "row blocks"


def reduce_amax_over(tensor: QuantizedTensor, group: Any) -> None:
    """Give ``tensor`` (a shard) a quantizer whose whole-tensor amax is reduced (MAX) over ``group``.

    Invariant: re-quantizing any shard in place yields the scale that re-quantizing the whole tensor
    would, so the shards' shared scales keep agreeing. Schemes without a whole-tensor amax (delayed
    scaling, whose scale comes from the recipe state; MXFP8; FP8 block scaling) are left as they are.
    """
    quantizer = tensor.quantizer
    if not isinstance(quantizer, (Float8CurrentScalingQuantizer, NVFP4Quantizer)):
        return
    if quantizer.with_amax_reduction and quantizer.amax_reduction_group is group:
        return
    quantizer = quantizer.copy()
    quantizer.with_amax_reduction = True
    quantizer.amax_reduction_group = group
    tensor._quantizer = quantizer


def pre_all_gather(tensor: QuantizedTensor, mesh: Any, orig_size: torch.Size, module: Any,
                   mp_policy: Any) -> tuple[tuple[torch.Tensor, ...], Any]:
    """``fsdp_pre_all_gather``: the shard's gather inputs, and the metadata to rebuild the whole."""
    what = f"{type(module).__name__} ({type(tensor).__name__} weight of shape {tuple(orig_size)})"
    cuttable(tensor, what=what)
    world = mesh.size()
    block = block_rows(tensor)
    if orig_size[0] % world or (orig_size[0] // world) % block:
        raise NotImplementedError(
            f"{what}: FSDP2 would cut it into shards of {orig_size[0] / world:g} rows over {world} ranks; a quantized "
            f"shard must have a whole number of rows that is a multiple of {block} (its scaling block). "
            "Choose sizes that shard evenly, or keep this weight in high precision"
        )
    reduce_amax_over(tensor, mesh.get_group())
    if world == 1:
        # FSDP2 copies only the first all-gather input of a one-rank mesh (its world-size-1 shortcut), so
        # the shard travels as one tensor: its row blocks, every array and scale in one uint8 matrix.
        return (encode_row_blocks(tensor, what=what),), (_ONE_TENSOR, what)
    plan, inputs = gather_inputs(tensor, usages_of(tensor), what=what)
    return tuple(_canonical(a) for a in inputs), (plan, torch.Size(orig_size), what)


def _agreed(plan: GatherPlan, outputs: tuple[torch.Tensor, ...], what: str) -> dict[str, torch.Tensor]:
    """The one value of each whole-tensor array that every rank's shard holds (a row per rank), or an error.

    Shards quantized with different scales cannot form one tensor: one rank's scale applied to
    another rank's bytes gives wrong values. Delayed scaling keeps the ranks' scales equal only when
    its amaxes are reduced over the data-parallel group.
    """
    bad = first_disagreement(plan, outputs)
    if bad is not None:
        kw, gathered = bad
        raise RuntimeError(
            f"{what}: the shards carry different {kw} ({[row.tolist() for row in gathered]}), so they cannot be "
            "gathered into one weight. Under delayed scaling, keep the recipe's reduce_amax=True and give autocast "
            "the data-parallel group (te.autocast(recipe=..., amax_reduction_group=group); None is the world "
            "group) so that every rank's scales update alike"
        )
    return {kw: gathered[0].clone() for kw, gathered in zip(plan.shared, outputs[len(plan.arrays):])}


def _canonical(array: torch.Tensor) -> torch.Tensor:
    """``array`` with row-major strides even in its size-1 dims (FSDP2 flattens and byte-views its inputs)."""
    strides, step = [], 1
    for size in reversed(array.shape):
        strides.append(step)
        step *= max(size, 1)
    if tuple(reversed(strides)) == tuple(array.stride()):
        return array
    return torch.empty(array.shape, dtype=array.dtype, device=array.device).copy_(array)


def post_all_gather(shard: QuantizedTensor, outputs: tuple[torch.Tensor, ...], metadata: Any,
                    param_dtype: torch.dtype, *, out: Optional[QuantizedTensor] = None
                    ) -> Optional[tuple[QuantizedTensor, tuple[torch.Tensor, ...]]]:
    """``fsdp_post_all_gather``: the unsharded tensor (or ``out`` refilled in place), and its arrays.

    The arrays are returned as FSDP2's "inner tensors": FSDP2 frees their storage when it reshards
    and re-allocates it before the next gather, when this function refills ``out`` in place.
    """
    if metadata[0] == _ONE_TENSOR:  # a one-rank mesh: the shard's own row blocks
        whole = decode_row_blocks(outputs[0], like=shard, rows=shard.shape[0], what=metadata[1])
    else:
        plan, shape, what = metadata
        shared = {kw: value.reshape(shard.get_metadata()[kw].shape) for kw, value in _agreed(plan, outputs, what).items()}
        whole = assemble(shard, plan, outputs, shape=shape, shared=shared)
    if out is not None:
        for kw, attr in type(out)._CTOR_TENSORS.items():
            fresh, current = getattr(whole, attr), getattr(out, attr)
            if fresh is None:
                continue
            if current is None or current.shape != fresh.shape:
                setattr(out, attr, fresh)
            else:
                current.copy_(fresh)
        return None
    if param_dtype != whole.dtype:
        whole = type(whole).make_like(whole, dtype=param_dtype)
    inner = tuple({id(t): t for t in (getattr(whole, a) for a in whole._array_names()) if t is not None}.values())
    return whole, inner


FSDP2_ALL_GATHER.update({"pre": pre_all_gather, "post": post_all_gather})
