"""Quantized weights sharded by FSDP2 in distributed checkpoints (``torch.distributed.checkpoint``), bit-exact.

A sharded quantized weight is a DTensor whose local tensor is a ``QuantizedTensor``. DCP saves a DTensor by
pickling its local tensor, which refops refuses (a checkpoint never runs code on load), and it reshards by
slicing tensors along their dims, which a quantized tensor's arrays (transposed copies, padded scales,
whole-tensor scales) do not follow. So ``state_dict()`` stores such a weight as a DTensor of **row blocks**
(:mod:`refops.quantization.row_blocks`): a plain uint8 matrix, one row per block of the weight's rows, sharded
along dim 0 exactly as the weight is. DCP writes it, gathers it for a full state dict and reshards it like
any plain tensor; the blocks of any range of rows decode on their own, so a checkpoint saved on 2 ranks loads
on 1 (or the reverse) bit for bit.

Loading writes the decoded bytes and scales into the existing local ``QuantizedTensor`` in place (the same
DTensor object, the quantizer it has). Accepted: the row blocks as a DTensor (a sharded state dict, or a
full one that ``set_model_state_dict`` distributed), as a plain tensor (a full state dict), or a
single-process checkpoint's encoded weight (:mod:`refops.ops.quantized_checkpoint`). Anything stored another
way is an error naming the op and the parameter.
"""

from __future__ import annotations

from typing import Any

import torch

from ..quantization.quantized_tensor import QuantizedTensor
from ..quantization.row_blocks import block_rows, decode_row_blocks, encode_row_blocks, is_row_blocks, row_block_width
from .fsdp import is_dtensor, local_shard_of

__all__ = ["is_sharded_quantized", "sharded_row_blocks", "decode_sharded_entry", "agreed_recipe_state"]


def is_sharded_quantized(param: Any) -> bool:
    """Whether ``param`` is a DTensor whose local tensor is a ``QuantizedTensor`` (an FSDP2-sharded quantized weight)."""
    return is_dtensor(param) and isinstance(param._local_tensor, QuantizedTensor)


def _check_placements(param: Any, *, what: str) -> None:
    """Row blocks follow dim 0: every placement must shard dim 0 or replicate (FSDP2: ``Shard(0)``; HSDP too)."""
    from torch.distributed.tensor import Replicate, Shard

    for placement in param.placements:
        if not (isinstance(placement, Replicate) or (isinstance(placement, Shard) and placement.dim == 0)):
            raise NotImplementedError(
                f"{what}: a quantized weight can be checkpointed only when sharded along dim 0 (FSDP2's Shard(0)) "
                f"or replicated; this one is placed as {param.placements}"
            )


def _block_layout(param: Any, *, what: str) -> tuple[int, int, torch.Size, tuple[int, ...], tuple[int, ...]]:
    """``(g, width, global blocks shape, this rank's block count and offset)`` of ``param``'s row blocks.

    Checks that this rank's rows start on a block bound and that DTensor's chunking of the blocks gives this
    rank exactly the blocks of its rows (true whenever FSDP2 could shard the weight quantized).
    """
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _check_placements(param, what=what)
    local = param._local_tensor
    g = block_rows(local, what=what)
    width = row_block_width(local, what=what)
    blocks_shape = torch.Size((-(-param.shape[0] // g), width))
    rows, row_offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    sizes, offsets = compute_local_shape_and_global_offset(blocks_shape, param.device_mesh, param.placements)
    mine = -(-rows[0] // g)
    if row_offset[0] % g or offsets[0] * g != row_offset[0] or sizes[0] != mine:
        raise NotImplementedError(
            f"{what}: this rank holds rows [{row_offset[0]}, {row_offset[0] + rows[0]}) of the weight, which do not "
            f"map to whole {g}-row blocks as the checkpoint shards them; choose sizes whose shards are multiples of "
            f"{g} rows"
        )
    return g, width, blocks_shape, tuple(sizes), tuple(offsets)


def sharded_row_blocks(param: Any, *, what: str) -> Any:
    """The state-dict entry of sharded quantized weight ``param``: a DTensor of its row blocks, sharded as it is."""
    from torch.distributed.tensor import DTensor

    _, width, blocks_shape, _, _ = _block_layout(param, what=what)
    blocks = encode_row_blocks(param._local_tensor, what=what)
    return DTensor.from_local(blocks, param.device_mesh, param.placements, run_check=False, shape=blocks_shape,
                              stride=(width, 1))


def decode_sharded_entry(param: Any, value: Any, *, what: str, decode_encoded: Any) -> QuantizedTensor:
    """This rank's shard of sharded quantized weight ``param``, decoded from checkpoint entry ``value``.

    ``value``: row blocks (a DTensor sharded like ``param``'s blocks, or a plain full matrix), or an entry
    ``decode_encoded(value_or_full_tensor)`` turns into the whole quantized weight (a single-process
    checkpoint's encoding, possibly distributed by ``set_model_state_dict`` as a DTensor of bytes: gathered
    first, a collective every rank makes for the same keys). Returns a tensor stored like ``param``'s local
    shard, to be copied into it; raises ``ValueError`` naming ``what`` for anything else.
    """
    local = param._local_tensor
    rows, _ = _local_rows(param)
    if is_dtensor(value) and value.dim() == 2 and value.dtype == torch.uint8:
        _, width, blocks_shape, sizes, _ = _block_layout(param, what=what)
        if tuple(value.shape) != tuple(blocks_shape) or value.placements != param.placements:
            raise ValueError(
                f"{what}: the checkpoint's row blocks have shape {tuple(value.shape)} placed {value.placements}, "
                f"expected {tuple(blocks_shape)} placed {param.placements} (this weight stored quantized as it is)"
            )
        return decode_row_blocks(local, value.to_local(), rows=rows, what=what)
    if is_row_blocks(value):
        g, width, blocks_shape, sizes, offsets = _block_layout(param, what=what)
        if tuple(value.shape) != tuple(blocks_shape):
            raise ValueError(f"{what}: the checkpoint holds {tuple(value.shape)} row blocks, expected "
                             f"{tuple(blocks_shape)} for this weight stored quantized as it is")
        return decode_row_blocks(local, value[offsets[0] : offsets[0] + sizes[0]], rows=rows, what=what)
    full = value.full_tensor() if is_dtensor(value) else value
    whole = decode_encoded(full)
    if whole is None:
        raise ValueError(
            f"{what} is an FSDP2-sharded quantized weight but the checkpoint holds a plain "
            f"{getattr(value, 'dtype', type(value).__name__)} tensor; save and load with the same recipe, or "
            "convert a single-process checkpoint with refops.ops.quantized_checkpoint.dequantize_state_dict and "
            "build a plain model"
        )
    if type(whole) is not type(local) or tuple(whole.shape) != tuple(param.shape):
        raise ValueError(f"{what}: the checkpoint holds a {type(whole).__name__} of shape {tuple(whole.shape)}, "
                         f"expected a {type(local).__name__} of shape {tuple(param.shape)}")
    return local_shard_of(whole.to(local.device), param, what=what)


def _local_rows(param: Any) -> tuple[int, int]:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    rows, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return rows[0], offset[0]


def agreed_recipe_state(op: Any, state: dict[str, Any]) -> dict[str, Any]:
    """The recipe state ``op`` checkpoints: for an op whose parameters FSDP2 shards, the same on every rank.

    Delayed scaling records each rank's amaxes in ``amax_history[0]`` between updates (a rank's weight shard,
    re-quantized by the optimizer, records its own shard's amax), and reduces them (MAX) over the ranks only
    at the next update. A distributed checkpoint keeps one copy of a plain tensor (the extra state) for all
    ranks, so these pending amaxes are reduced now, on a copy: every rank saves the same state, a load on any
    number of ranks holds it, and the next update gives the scales the uninterrupted run gets (MAX over the
    ranks either way). The reduction is over the default group, as the update's (TE's default); it runs only
    for a sharded op under a recipe with ``reduce_amax`` and more than one rank, and makes its
    ``state_dict()`` a collective, as the sharded model's state dicts already are by convention.
    """
    dist = torch.distributed
    if not state or not state.get("recipe", {}).get("reduce_amax", False):
        return state
    if not any(is_dtensor(p) for p in op._parameters.values() if p is not None):
        return state
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return state
    states = {}
    for mode, tensors in state["states"].items():
        history = tensors["amax_history"].clone()
        dist.all_reduce(history, op=dist.ReduceOp.MAX)
        states[mode] = {**tensors, "amax_history": history}
    return {**state, "states": states}
