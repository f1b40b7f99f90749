"""FSDP2-sharded quantized weights in checkpoints: a DTensor of row blocks, sharded as the weight is.

A sharded quantized weight is a DTensor whose local tensor is a ``QuantizedTensor``. DCP saves a DTensor by
pickling its local tensor, which refops refuses (a checkpoint never runs code on load), and it reshards by
slicing tensors along their dims. So its state-dict entry is a DTensor of its **row blocks**
(:mod:`refops.sharding.row_blocks`), the same matrix a single process stores, sharded along dim 0 exactly as
the weight is: DCP writes it, gathers it for a full state dict and reshards it like any plain tensor, and a
checkpoint saved on any number of ranks (one process included) loads on any other, bit for bit.

Loading decodes this rank's blocks into a tensor stored exactly as the local shard is, whose bytes and
scales the caller copies into the local ``QuantizedTensor`` in place (the same DTensor object, the quantizer
it has). Accepted: the row blocks as a DTensor (a sharded state dict, or a full one that
``set_model_state_dict`` distributed), as a plain matrix (a full state dict), or an entry a legacy decoder
turns into the whole weight. Anything stored another way is an error naming the op and the parameter.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from ..layouts import ceil_div
from ..ops.dtensor_parameters import local_shard_of
from ..quantization.dtensor import is_dtensor
from ..quantization.quantized_tensor import QuantizedTensor
from .row_blocks import decode_row_blocks, encode_row_blocks, is_row_blocks, row_block_width
from .row_major import block_rows

__all__ = ["is_sharded_quantized", "sharded_row_blocks", "decode_sharded_entry"]


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


def _local_rows(param: Any) -> tuple[int, int]:
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    rows, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return rows[0], offset[0]


def _block_layout(param: Any, *, what: str) -> tuple[torch.Size, int, int]:
    """``(global blocks shape, this rank's block count, its first block)`` of ``param``'s row blocks.

    Checks that this rank's rows start on a block bound and that DTensor's chunking of the blocks gives this
    rank exactly the blocks of its rows (true whenever FSDP2 could shard the weight quantized).
    """
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    _check_placements(param, what=what)
    local = param._local_tensor
    g = block_rows(local, what=what)
    blocks_shape = torch.Size((ceil_div(param.shape[0], g), row_block_width(local, what=what)))
    rows, row_offset = _local_rows(param)
    sizes, offsets = compute_local_shape_and_global_offset(blocks_shape, param.device_mesh, param.placements)
    if row_offset % g or offsets[0] * g != row_offset or sizes[0] != ceil_div(rows, g):
        raise NotImplementedError(
            f"{what}: this rank holds rows [{row_offset}, {row_offset + rows}) of the weight, which do not "
            f"map to whole {g}-row blocks as the checkpoint shards them; choose sizes whose shards are multiples of "
            f"{g} rows"
        )
    return blocks_shape, sizes[0], offsets[0]


def sharded_row_blocks(param: Any, *, what: str) -> Any:
    """The state-dict entry of sharded quantized weight ``param``: a DTensor of its row blocks, sharded as it is
    (each rank's blocks are rows of the blocks a single process stores for the whole weight)."""
    from torch.distributed.tensor import DTensor

    blocks_shape, _, _ = _block_layout(param, what=what)
    blocks = encode_row_blocks(param._local_tensor, what=what)
    return DTensor.from_local(blocks, param.device_mesh, param.placements, run_check=False, shape=blocks_shape,
                              stride=(blocks_shape[1], 1))


def decode_sharded_entry(param: Any, value: Any, *, what: str,
                         decode_legacy: Callable[[torch.Tensor], Optional[QuantizedTensor]]) -> QuantizedTensor:
    """This rank's shard of sharded quantized weight ``param``, decoded from checkpoint entry ``value``.

    ``value``: row blocks (a DTensor sharded like ``param``'s blocks, or a plain full matrix), or an entry
    ``decode_legacy(value_or_full_tensor)`` turns into the whole quantized weight (a single-process checkpoint
    of the legacy form, possibly distributed by ``set_model_state_dict`` as a DTensor of bytes: gathered first,
    a collective every rank makes for the same keys). Returns a tensor to be copied into ``param``'s local
    shard; raises ``ValueError`` naming ``what`` for anything else.
    """
    local = param._local_tensor
    rows, _ = _local_rows(param)
    if is_dtensor(value) and value.dim() == 2 and value.dtype == torch.uint8:
        blocks_shape, _, _ = _block_layout(param, what=what)
        if tuple(value.shape) != tuple(blocks_shape) or value.placements != param.placements:
            raise ValueError(
                f"{what}: the checkpoint's row blocks have shape {tuple(value.shape)} placed {value.placements}, "
                f"expected {tuple(blocks_shape)} placed {param.placements} (this weight stored quantized as it is)"
            )
        return decode_row_blocks(value.to_local(), like=local, rows=rows, what=what)
    if is_row_blocks(value):
        blocks_shape, count, first = _block_layout(param, what=what)
        if tuple(value.shape) != tuple(blocks_shape):
            raise ValueError(f"{what}: the checkpoint holds {tuple(value.shape)} row blocks, expected "
                             f"{tuple(blocks_shape)} for this weight stored quantized as it is")
        return decode_row_blocks(value[first : first + count].to(local.device), like=local, rows=rows, what=what)
    full = value.full_tensor() if is_dtensor(value) else value
    whole = decode_legacy(full)
    if whole is None:
        raise ValueError(
            f"{what} is an FSDP2-sharded quantized weight but the checkpoint holds a plain "
            f"{getattr(value, 'dtype', type(value).__name__)} tensor; save and load with the same recipe, or "
            "convert the checkpoint with refops.ops.quantized_checkpoint.dequantize_state_dict and build a plain model"
        )
    if type(whole) is not type(local) or tuple(whole.shape) != tuple(param.shape):
        raise ValueError(f"{what}: the checkpoint holds a {type(whole).__name__} of shape {tuple(whole.shape)}, "
                         f"expected a {type(local).__name__} of shape {tuple(param.shape)}")
    return local_shard_of(whole.to(local.device), param, what=what)
