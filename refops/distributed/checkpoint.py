"""Distributed checkpoints of another recipe refused before anything loads: :func:`load` and its planner.

``torch.distributed.checkpoint.load`` plans from the checkpoint's metadata (keys, sizes, dtypes), then reads, and
copies each plain tensor into the target *in place* as it reads it. What recipe saved an op is in data, not in
metadata: an op's ``_extra_state`` (delayed scaling's recipe and state) and the header at the start of each
quantized weight's row blocks (:mod:`refops.sharding.row_blocks`: tensor class, quantizer, format). So a plain
``dcp.load`` of another recipe's checkpoint either stops at torch's planner ("Size mismatch", naming a key and no
recipe) or reaches refops only in ``set_state_dict``, after the norms, biases and optimizer moments were
overwritten.

:func:`check_checkpoint` reads only that data first, into scratch (every ``_extra_state`` entry and the first
:data:`~refops.sharding.row_blocks.HEADER_PREFIX_BYTES` bytes of row 0 of every 2-D uint8 entry), and compares it,
op by op, with the target state dict's own: its ``_extra_state`` bytes and its weights (row blocks, or plain).
Every tensor key's size and dtype is compared with the metadata too. Any difference is a
:class:`~refops.ops.checkpoint_errors.CheckpointMismatchError` naming the op (its key prefix, e.g.
``model.1.basic_ops.0``), the recipe and weight form of the checkpoint and of the target, and the tensor; nothing
of the target has been touched. :func:`load` checks, agrees on the verdict over the process group (every rank
raises the same error), then runs ``dcp.load``. :class:`RecipeCheckingLoadPlanner` makes the same check inside a
plain ``dcp.load`` (there DCP wraps a rank's error in its ``CheckpointException``).

What counts as another recipe: a quantized weight saved by another scheme, quantizer or quantizer options; a
quantized weight saved for a plain one, or the reverse (the state-dict forms differ: row blocks against the
values); delayed-scaling state of another op's shape. A plain-weight op takes whatever recipe state the checkpoint
holds, as ``load_state_dict`` does (a plain weight is the same under every recipe): a plain model that ran under
one recipe loads the plain checkpoint of another.
"""

from __future__ import annotations

import json
import warnings
from typing import Any, Optional

import torch

from ..ops.checkpoint_errors import CheckpointMismatchError
from ..ops.extra_state import decode_extra_state
from ..quantization.dtensor import is_dtensor
from ..sharding.row_blocks import HEADER_PREFIX_BYTES, RowBlockHeader, read_first_header, scheme_mismatch

__all__ = ["CheckpointMismatchError", "RecipeCheckingLoadPlanner", "check_checkpoint", "checkpoint_problems", "load"]

_EXTRA = "_extra_state"
#: The recipe whose weights each refops quantizer stores (the quantizer class a row-block header names).
RECIPE_OF_QUANTIZER = {
    "Float8Quantizer": "DelayedScaling",
    "Float8CurrentScalingQuantizer": "Float8CurrentScaling",
    "MXFP8Quantizer": "MXFP8BlockScaling",
    "Float8BlockQuantizer": "Float8BlockScaling",
    "NVFP4Quantizer": "NVFP4BlockScaling",
}
_NOT_ROW_BLOCKS = "plain uint8"  # a 2-D uint8 tensor without the magic: plain values


def _dcp():
    import torch.distributed.checkpoint as dcp

    return dcp


def _default_planner_class():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    return DefaultLoadPlanner


# ----------------------------------------------------------------------------------------------------- scratch read
def _scratch_planner():
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex
    from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class _ScratchPlanner(_default_planner_class()):
        """Reads a flat dict of scratch values: bytes whole, tensors from the checkpoint's origin (for a header
        key, row 0's first bytes only, whatever the saved size)."""

        def __init__(self) -> None:
            super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)

        def create_local_plan(self) -> LoadPlan:
            requests = []
            for fqn, obj in self.state_dict.items():
                md = self.metadata.state_dict_metadata[fqn]
                if isinstance(md, BytesStorageMetadata):
                    requests.append(ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(fqn),
                                             dest_offsets=torch.Size((0,)), storage_index=MetadataIndex(fqn),
                                             storage_offsets=torch.Size((0,)), lengths=torch.Size((0,))))
                else:
                    chunk = ChunkStorageMetadata(offsets=torch.Size([0] * obj.dim()), sizes=obj.shape)
                    requests += create_read_items_for_chunk_list(fqn, md, [chunk])
            return LoadPlan(requests)

    return _ScratchPlanner()


def _read_scratch(metadata: Any, keys: set[str], reader: Any) -> dict[str, Any]:
    """The checkpoint's ``_extra_state`` values and row-0 header bytes of ``keys``' candidates, read into scratch
    by this rank alone (``no_dist``): nothing of the target is involved."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    scratch: dict[str, Any] = {}
    for key in keys:
        md = metadata.state_dict_metadata.get(key)
        if md is None:
            continue
        if key.rsplit(".", 1)[-1] == _EXTRA:
            if isinstance(md, BytesStorageMetadata):
                scratch[key] = None
            elif isinstance(md, TensorStorageMetadata):  # an older refops checkpoint: a uint8 tensor
                scratch[key] = torch.empty(md.size, dtype=md.properties.dtype)
        elif _header_candidate(md):
            scratch[key] = torch.zeros(1, min(md.size[1], HEADER_PREFIX_BYTES), dtype=torch.uint8)
    if scratch:
        with warnings.catch_warnings():  # no_dist's "assuming the intent is to load in a single process": it is
            warnings.simplefilter("ignore", UserWarning)
            _dcp().load(scratch, storage_reader=reader, planner=_scratch_planner(), no_dist=True)
    return scratch


def _header_candidate(md: Any) -> bool:
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    return (isinstance(md, TensorStorageMetadata) and md.properties.dtype == torch.uint8 and len(md.size) == 2
            and md.size[0] > 0 and md.size[1] >= 8)


# ----------------------------------------------------------------------------------------------------- the check
class _Side:
    """What one side (checkpoint or target) says of one op: its recipe state and the form of each weight."""

    def __init__(self, extra: dict[str, Any], weights: dict[str, Any]) -> None:
        self.extra = extra
        self.weights = weights  # name -> RowBlockHeader | "plain <dtype>" | "row blocks" (header on no local row)

    def recipe(self) -> Optional[str]:
        saved = self.extra.get("recipe") if isinstance(self.extra, dict) else None
        if saved:
            options = ", ".join(f"{k}={v}" for k, v in saved.items() if k != "type")
            return f"{saved.get('type')}({options})"
        for form in self.weights.values():
            if isinstance(form, RowBlockHeader) and form.quantizer is not None:
                return RECIPE_OF_QUANTIZER.get(form.quantizer, f"the recipe of {form.quantizer}")
        return None

    def describe(self) -> str:
        """E.g. ``MXFP8BlockScaling quantized weights ('weight': MXFP8Tensor made by MXFP8Quantizer, ...)``."""
        quantized = {n: f for n, f in self.weights.items() if not _is_plain(f)}
        recipe = self.recipe()
        if quantized:
            forms = "; ".join(f"'{n}': {_form_words(f)}" for n, f in quantized.items())
            return f"{recipe or 'unnamed-recipe'} quantized weights ({forms})"
        if not self.weights:
            return f"{recipe} state" if recipe else "no recipe state"
        return f"{recipe} state and plain weights" if recipe else "plain weights and no recipe state"


def _is_plain(form: Any) -> bool:
    return isinstance(form, str) and form.startswith("plain")


def _form_words(form: Any) -> str:
    if isinstance(form, RowBlockHeader):
        made_by = f" made by {form.quantizer}" if form.quantizer else ""
        meta = json.dumps({k: int(v) for k, v in form.meta.items()})
        return f"{form.tensor_class.__name__}{made_by}, {form.cols} columns, {meta}"
    return form


def _local(value: Any) -> Any:
    return value._local_tensor if is_dtensor(value) else value


def _target_form(value: Any) -> Any:
    """A target weight's form: the header of its (local) row blocks, or ``"plain <dtype>"``."""
    local = _local(value)
    if not isinstance(local, torch.Tensor) or local.dtype != torch.uint8 or local.dim() != 2 or value.shape[1] < 8:
        return f"plain {str(value.dtype).removeprefix('torch.')}"
    if local.shape[0] == 0 or local.is_meta:
        return "row blocks"  # this rank holds no block; the others name the scheme
    try:
        return read_first_header(bytes(local[0, :HEADER_PREFIX_BYTES].cpu().tolist()))
    except ValueError:
        return _NOT_ROW_BLOCKS


def _saved_form(key: str, md: Any, scratch: dict[str, Any]) -> Any:
    if key in scratch and isinstance(scratch[key], torch.Tensor):
        try:
            return read_first_header(bytes(scratch[key][0].tolist()))
        except ValueError:
            return _NOT_ROW_BLOCKS
    dtype = getattr(getattr(md, "properties", None), "dtype", None)
    return f"plain {str(dtype).removeprefix('torch.')}"


def _decoded(value: Any, *, owner: str) -> tuple[dict[str, Any], Optional[str]]:
    try:
        return decode_extra_state(value, owner=owner), None
    except (TypeError, ValueError) as error:
        return {}, str(error)


def _size_and_dtype(value: Any) -> Optional[tuple[tuple[int, ...], torch.dtype]]:
    if isinstance(value, torch.Tensor):
        return tuple(value.shape), value.dtype
    return None


def checkpoint_problems(state_dict: dict[str, Any], metadata: Any, scratch: dict[str, Any]) -> list[str]:
    """What keeps the flat ``state_dict`` (DCP's flattened keys) from loading the checkpoint of ``metadata``, whose
    ``_extra_state`` values and row-0 header bytes ``scratch`` holds (:func:`_read_scratch`); empty: nothing."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    saved_md = metadata.state_dict_metadata
    problems: list[str] = []
    reported: set[str] = set()
    ops = sorted(k[: -len(_EXTRA) - 1] for k in state_dict if k.rsplit(".", 1)[-1] == _EXTRA)
    for op in ops:
        extra_key = f"{op}.{_EXTRA}"
        names = [k[len(op) + 1:] for k, v in state_dict.items()
                 if k.startswith(op + ".") and "." not in k[len(op) + 1:] and k != extra_key
                 and isinstance(v, torch.Tensor)]
        target_extra, _ = _decoded(state_dict[extra_key], owner=extra_key)
        saved_extra, corrupt = _decoded(scratch.get(extra_key), owner=f"the checkpoint's {extra_key}")
        if corrupt is not None:
            problems.append(f"{op}: {corrupt}")
            reported.add(op)
            continue
        names = [n for n in names if f"{op}.{n}" in saved_md]
        target = _Side(target_extra, {n: _target_form(state_dict[f"{op}.{n}"]) for n in names})
        saved = _Side(saved_extra, {n: _saved_form(f"{op}.{n}", saved_md[f"{op}.{n}"], scratch) for n in names})
        details = []
        for name in names:
            mine, theirs = target.weights[name], saved.weights[name]
            key = f"{op}.{name}"
            if _is_plain(mine) != _is_plain(theirs):
                details.append(f"'{name}' ({key}) is {_stored(theirs)} in the checkpoint, {_stored(mine)} here")
            elif isinstance(mine, RowBlockHeader) and isinstance(theirs, RowBlockHeader):
                why = scheme_mismatch(theirs, mine)
                if why is not None:
                    details.append(f"'{name}' ({key}) was quantized with {why}")
        details += _delayed_state_mismatch(saved_extra, target_extra)
        if details:
            problems.append(
                f"{op}: the checkpoint holds {saved.describe()}, this model's op {target.describe()}: "
                f"{'; '.join(details)}"
            )
            reported.add(op)
    for key, value in state_dict.items():
        if key not in saved_md or key.rsplit(".", 1)[0] in reported:
            continue
        md, mine = saved_md[key], _size_and_dtype(value)
        if mine is None:
            continue
        if isinstance(md, BytesStorageMetadata):
            problems.append(f"{key}: the checkpoint holds an object (not a tensor) here, this model a tensor of "
                            f"size {list(mine[0])} and dtype {mine[1]}")
        elif isinstance(md, TensorStorageMetadata) and (tuple(md.size), md.properties.dtype) != mine:
            problems.append(f"{key}: the checkpoint holds a tensor of size {list(md.size)} and dtype "
                            f"{md.properties.dtype}, this model one of size {list(mine[0])} and dtype {mine[1]}")
    return problems


def _stored(form: Any) -> str:
    return f"plain ({form.removeprefix('plain ')})" if _is_plain(form) else "quantized (row blocks)"


def _delayed_state_mismatch(saved: dict[str, Any], target: dict[str, Any]) -> list[str]:
    """Delayed-scaling state of both sides whose quantizers do not match (saved by another op)."""
    if not saved.get("states") or not target.get("states"):
        return []
    out = []
    for mode, tensors in saved["states"].items():
        mine = target["states"].get(mode)
        theirs_shape = tuple(tensors["scale"].shape) if "scale" in tensors else None
        mine_shape = tuple(mine["scale"].shape) if mine and "scale" in mine else None
        if mine is not None and theirs_shape != mine_shape:
            out.append(f"its {mode} delayed-scaling state holds {theirs_shape} scales in the checkpoint, "
                       f"{mine_shape} here (saved by another op?)")
    return out


# ----------------------------------------------------------------------------------------------------- the API
def _reader(checkpoint_id: Any, storage_reader: Any) -> Any:
    if storage_reader is not None:
        if checkpoint_id is not None and hasattr(storage_reader, "reset"):
            storage_reader.reset(checkpoint_id)
        return storage_reader
    if checkpoint_id is None:
        raise TypeError("refops.distributed: give checkpoint_id (a directory) or storage_reader")
    return _dcp().FileSystemReader(checkpoint_id)


def _flat(state_dict: dict[str, Any]) -> dict[str, Any]:
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    return flatten_state_dict(state_dict)[0]


_FIX = ("Build the model as the checkpoint's was (under quantized_model_init(recipe=...) with its recipe for "
        "quantized weights, without it for plain ones); a quantized checkpoint for a plain model: load it into the "
        "quantized model, then convert with refops.ops.quantized_checkpoint.dequantize_state_dict")


def _error(problems: list[str], *, where: str) -> CheckpointMismatchError:
    return CheckpointMismatchError(
        f"{where}: the checkpoint does not fit this model; nothing was loaded, every tensor of the model and "
        "optimizer is as it was:\n- " + "\n- ".join(problems) + f"\n{_FIX}")


def check_checkpoint(state_dict: dict[str, Any], *, checkpoint_id: Any = None, storage_reader: Any = None,
                     process_group: Any = None) -> None:
    """Raise :class:`CheckpointMismatchError` on every rank if the checkpoint does not fit ``state_dict`` (the
    dict ``dcp.load`` would load, nested as ``{"model": ..., "optim": ...}`` or flat) on any rank; read only its
    metadata, ``_extra_state`` entries and quantized weights' headers. A collective when a process group exists."""
    reader = _reader(checkpoint_id, storage_reader)
    flat = _flat(state_dict)
    metadata = reader.read_metadata()
    problems = checkpoint_problems(flat, metadata, _read_scratch(metadata, set(flat), reader))
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(process_group) > 1:
        everyone: list[Any] = [None] * dist.get_world_size(process_group)
        dist.all_gather_object(everyone, problems, group=process_group)
        problems = list(dict.fromkeys(p for rank in everyone for p in rank))
    if problems:
        raise _error(problems, where="refops.distributed.load")


def load(state_dict: dict[str, Any], *, checkpoint_id: Any = None, storage_reader: Any = None,
         process_group: Any = None, planner: Any = None) -> None:
    """``torch.distributed.checkpoint.load``, after :func:`check_checkpoint`: a checkpoint of another recipe or
    weight form (or any tensor of another size or dtype) is a :class:`CheckpointMismatchError` naming the op, both
    recipes and the tensor, raised on every rank before any tensor of ``state_dict`` is written. Then loads as
    ``dcp.load`` does (``planner``: its planner, DCP's default if None); follow with ``set_state_dict``."""
    reader = _reader(checkpoint_id, storage_reader)
    check_checkpoint(state_dict, storage_reader=reader, process_group=process_group)
    _dcp().load(state_dict, storage_reader=reader, planner=planner, process_group=process_group)


class RecipeCheckingLoadPlanner(_default_planner_class()):
    """torch's ``DefaultLoadPlanner`` that first makes :func:`check_checkpoint`'s check, for a plain ``dcp.load``:
    ``dcp.load(state, checkpoint_id=d, planner=RecipeCheckingLoadPlanner(d))``.

    It reads the checkpoint's ``_extra_state`` entries and weight headers itself (from ``checkpoint_id``, or
    ``storage_reader``) while DCP plans, before DCP reads anything, and raises
    :class:`CheckpointMismatchError`; on more than one rank DCP hands every rank its ``CheckpointException``,
    whose ``failures`` hold the error (:func:`load` raises the error itself).
    """

    def __init__(self, checkpoint_id: Any = None, *, storage_reader: Any = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if checkpoint_id is None and storage_reader is None:
            raise TypeError("RecipeCheckingLoadPlanner: give checkpoint_id (the directory dcp.load reads) or a "
                            "storage_reader of its own, to read the recipe state before DCP plans")
        self._checkpoint_id, self._storage_reader = checkpoint_id, storage_reader

    def create_local_plan(self):
        reader = _reader(self._checkpoint_id, self._storage_reader)
        problems = checkpoint_problems(self.state_dict, self.metadata,
                                       _read_scratch(self.metadata, set(self.state_dict), reader))
        if problems:
            raise _error(problems, where="RecipeCheckingLoadPlanner")
        return super().create_local_plan()
