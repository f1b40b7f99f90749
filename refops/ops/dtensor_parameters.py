"""DTensor parameters (FSDP2, DTensor tensor parallelism) in refops ops: what the ops do with them and refuse.

What refops guarantees (``docs/distributed.md``):

* **Identity under sharding.** ``reset_parameters()`` on a DTensor parameter (the FSDP2 route for a
  meta-built model: ``fully_shard`` -> ``to_empty(device)`` -> ``reset_parameters()``) keeps the
  DTensor object. refops draws the *full* value with the construction RNG (every rank draws the same
  values, so every rank must run under the same seed), finalizes it (quantizes it, for a weight built
  under ``quantized_model_init``) and writes this rank's shard into the DTensor's local tensor in
  place (:func:`place_full_value_into_dtensor`). ``full_tensor()`` is then bit-equal to a single-process
  eager build under the same seed. A per-shard draw (DTensor's own RNG) would be cheaper for very large
  models but loses that parity; refops does full-value init.
* **Per-op sharding inside a refops ``Sequential`` is refused** with an error that names the fix: the
  fuser calls ``fuser_forward`` directly, so FSDP2's per-module hooks (which unshard the parameters)
  never run. Shard the root or a parent block, or use ``torch.nn.Sequential``.
* **DTensors are computed on in high precision only.** DTensor tensor parallelism (``distribute_module``)
  works without a recipe; under one, or with quantized weights, the fuser refuses and names refops'
  tensor-parallel ops (quantized shards under FSDP2 are plain local tensors inside DTensors, which FSDP2
  gathers through the sharding layer, ``refops.sharding``).
* **One recipe state for every rank** in a checkpoint (:func:`agreed_recipe_state`).

Nothing here imports ``torch.distributed.fsdp`` or ``torch.distributed.tensor`` unless the caller
already has: a process that never touched them pays one dictionary lookup per check.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable

import torch

from ..quantization.dtensor import dtensor_class, is_dtensor
from ..quantization.quantized_tensor import QuantizedTensor
from ..quantization.state import get_autocast_recipe

__all__ = [
    "local_shard_of",
    "place_full_value_into_dtensor",
    "check_fuser_parameters_unsharded",
    "agreed_recipe_state",
    "PER_OP_SHARDING_FIX",
]

#: The fix the per-op-sharding error names (also quoted by the docs).
PER_OP_SHARDING_FIX = (
    "apply fully_shard to the refops Sequential (the root) or to a parent block that contains it, "
    "or hold the ops in a torch.nn.Sequential so that each op's own hooks run"
)


def local_shard_of(full: torch.Tensor, like: Any, *, what: str) -> torch.Tensor:
    """This rank's part of ``full``, laid out as DTensor ``like`` lays out its global value.

    Invariant: the result has ``like._local_tensor``'s shape and holds exactly the elements of
    ``full`` that ``like.full_tensor()`` takes from this rank (``Shard(d)``: a slice along ``d``;
    ``Replicate``: everything). Partial placements hold no well-defined shard and are refused.
    ``full`` may be a ``QuantizedTensor`` (sliced along dim 0 only, keeping its bytes and scales).
    """
    from torch.distributed.tensor import Partial
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    if any(isinstance(p, Partial) for p in like.placements):
        raise ValueError(f"{what}: a DTensor with a Partial placement has no shard to initialize ({like.placements})")
    local_shape, offset = compute_local_shape_and_global_offset(full.shape, like.device_mesh, like.placements)
    shard = full
    for dim, (size, start) in enumerate(zip(local_shape, offset)):
        if size != full.shape[dim]:
            shard = shard.narrow(dim, start, size)
    return shard


def place_full_value_into_dtensor(param: Any, full: torch.Tensor, *, what: str) -> None:
    """Write this rank's shard of ``full`` into DTensor parameter ``param``, keeping ``param`` the same object.

    Invariant: afterwards ``param`` is the same DTensor (same spec, same ``requires_grad`` and
    attributes) and ``param.full_tensor()`` equals ``full``. A plain local shard receiving a plain value
    is overwritten in place (its storage is FSDP2's sharded buffer, so FSDP2 sees the new values); a
    local ``QuantizedTensor`` re-quantized in place; a plain local shard receiving a quantized value
    (a weight built under ``quantized_model_init`` on meta) becomes a ``QuantizedTensor`` local shard
    of the same DTensor, which FSDP2 picks up at its lazy initialization. Anything else raises: a
    DTensor is never replaced by a plain tensor.
    """
    local = param._local_tensor
    if local.is_meta:
        raise RuntimeError(
            f"{what}: this DTensor parameter's local shard is on the meta device. With FSDP2 the only "
            "route from meta is module.to_empty(device=...) followed by module.reset_parameters()"
        )
    shard = local_shard_of(full, param, what=what)
    if tuple(shard.shape) != tuple(local.shape):
        raise RuntimeError(
            f"{what}: the local shard has shape {tuple(local.shape)} but this rank's part of the "
            f"initial value has shape {tuple(shard.shape)}"
        )
    with torch.no_grad():
        if isinstance(shard, QuantizedTensor) and not isinstance(local, QuantizedTensor):
            param._local_tensor = shard.to(device=local.device)
        elif isinstance(local, QuantizedTensor) and not isinstance(shard, QuantizedTensor):
            raise RuntimeError(
                f"{what}: the local shard is a {type(local).__name__} but the initial value is a plain "
                "tensor; refops does not dequantize a sharded quantized weight"
            )
        else:
            local.copy_(shard)


def check_fuser_parameters_unsharded(ops: Iterable[torch.nn.Module]) -> None:
    """Before a fuser runs: no op holds parameters that FSDP2 left sharded, and no DTensor meets quantization.

    1. A refops fuser calls ``fuser_forward`` directly, so when ``fully_shard`` was applied to an op
       *inside* a refops ``Sequential`` (or to a basic op inside a container), FSDP2's pre-forward
       hook, which would unshard that op's parameters, never runs, and the op would compute with
       DTensor shards ("mixed torch.Tensor and DTensor"). This raises a refops error naming the fix.
    2. DTensor parameters that are meant to stay DTensors (torch's tensor parallelism through
       ``distribute_module``) work in high precision only: refops' quantizers take plain tensors.
       Under a quantization recipe, or with quantized weights, this raises a refops error naming
       refops' own tensor-parallel path instead of failing inside a quantizer.

    Cheap: returns at once unless ``torch.distributed.tensor`` was imported.
    """
    dtensor = dtensor_class()
    if dtensor is None:
        return
    for op in ops:
        sharded = [name for name, p in op.named_parameters() if isinstance(p, dtensor)]
        if sharded:
            _check_sharded_op(op, sharded)


def _check_sharded_op(op: torch.nn.Module, sharded: list[str]) -> None:
    """Raise for an op whose parameters ``sharded`` are DTensors at forward time (see the caller)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    fsdp_module = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    wrapped = [m for m in op.modules() if fsdp_module is not None and isinstance(m, fsdp_module)]
    if wrapped:
        name = type(wrapped[0]).__name__.removeprefix("FSDP")
        raise RuntimeError(
            f"{name}: fully_shard was applied to this op, and its parameters {sharded} are still "
            "sharded DTensors when the refops fuser runs it: the fuser calls fuser_forward directly, "
            f"so FSDP2's per-module unshard hooks never fire. Fix: {PER_OP_SHARDING_FIX}"
        )
    params = dict(op.named_parameters())
    quantized_weights = [n for n in sharded if isinstance(params[n]._local_tensor, QuantizedTensor)]
    recipe = get_autocast_recipe()
    if recipe is not None or quantized_weights:
        reason = f"under {type(recipe).__name__}" if recipe is not None else f"with quantized weights {quantized_weights}"
        raise NotImplementedError(
            f"{type(op).__name__}: its parameters {sharded} are DTensors (torch tensor parallelism, e.g. "
            f"distribute_module) and it runs {reason}; refops quantizes plain tensors only, so DTensor tensor "
            "parallelism works in high precision only. For quantized tensor parallelism use refops' "
            "tensor-parallel ops (Linear(..., tensor_parallel_mode='column' or 'row', tensor_parallel_group=...)), "
            "see docs/tensor-parallel.md"
        )


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
