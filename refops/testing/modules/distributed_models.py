"""``compare_modules`` on distributed models: FSDP2-sharded ones (DTensor parameters, quantized shards included)
and tensor-parallel ones built with any process group.

What the oracle needs from a distributed model, and how it gets it:

* **values**: a DTensor parameter's value is its full value (:func:`full_value`, a collective); giving the
  reference a value writes this rank's shard of it into the reference's DTensor (:func:`assign_full_value`),
  a quantized shard re-quantized with its amax reduced over the shard group, so that the ranks' whole-tensor
  scales agree as FSDP2's gather requires;
* **copies**: a deep copy shares the process groups it meets (:func:`deepcopy_sharing_groups`): a
  ``ProcessGroup`` cannot be pickled, and a copy of a tensor-parallel op must talk to the same ranks;
* **twins of an FSDP2 reference** are single-process modules (:func:`single_process_copy`): every sharded
  parameter replaced by its unsharded value (what FSDP2 all-gathers, quantized bytes included), FSDP2's class,
  hooks and state dropped. Each rank runs them on its own inputs, and their parameter grads are reduced over
  the FSDP2 mesh as FSDP2 reduces the reference's (the sum over the ranks divided by the gradient divide
  factor, by default the mesh size: data parallelism's mean), so that on every rank the candidate's and the
  reference's full grads are judged against a single-process float64 run of the same parameters.

Every collective here runs on every rank in the same order, because every rank runs the same script: a side
that raises on one rank only leaves the others waiting in their next collective (the rank launcher's
timeout then ends the run).
"""

from __future__ import annotations

import contextlib
import copy
import types
from collections import OrderedDict
from typing import Any, Callable, Iterator, Optional

import torch

from ...ops.dtensor_parameters import local_shard_of
from ...quantization.dtensor import is_dtensor
from ...quantization.quantized_tensor import QuantizedTensor
from ...sharding.fsdp2_all_gather import reduce_amax_over

__all__ = ["assign_full_value", "deepcopy_sharing_groups", "full_value", "is_fsdp_sharded", "reduce_like_fsdp",
           "reduce_twin_grads_like", "reshard_after_no_grad_forward", "single_process_copy", "twin_source"]

#: How deep :func:`_groups_reachable_from` follows plain objects' attributes (a TP op's config holds its group).
_SEARCH_DEPTH = 8


def full_value(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's full high-precision value on this rank (a collective; a quantized shard dequantized first)."""
    from torch.distributed.tensor import DTensor

    local = t.to_local()
    if isinstance(local, QuantizedTensor):
        local = local.dequantize()
    whole = DTensor.from_local(local.detach(), t.device_mesh, t.placements, shape=t.shape, stride=t.stride())
    return whole.full_tensor()


def assign_full_value(target: torch.Tensor, values: torch.Tensor, *, what: str) -> None:
    """Write this rank's shard of the full value ``values`` into DTensor ``target``, keeping the DTensor object.

    A quantized shard is re-quantized from its part of ``values``, its whole-tensor amax reduced over the
    shard group first (every rank then finds the scale one process would), and the amax it records put back.
    """
    local = target._local_tensor
    shard = local_shard_of(values.detach(), target, what=what)
    if tuple(shard.shape) != tuple(local.shape):
        raise ValueError(f"compare_modules: {what}: this rank's local shard has shape {tuple(local.shape)}, but its "
                         f"part of the value has shape {tuple(shard.shape)}; expected the two to match")
    with torch.no_grad():
        if isinstance(local, QuantizedTensor):
            if target.device_mesh.ndim == 1:
                reduce_amax_over(local, target.device_mesh.get_group())
            quantizer = local.quantizer
            amax = getattr(quantizer, "amax", None)
            saved = amax.clone() if isinstance(amax, torch.Tensor) else None
            local.quantize_(shard.to(device=local.device))
            if saved is not None:
                quantizer.amax.copy_(saved)
        else:
            local.copy_(shard.to(dtype=local.dtype, device=local.device))


# ------------------------------------------------------------------ copies that share process groups
def _process_group_class() -> Optional[type]:
    if not torch.distributed.is_available():
        return None
    return torch.distributed.ProcessGroup


def _groups_reachable_from(root: Any) -> dict[int, Any]:
    """Every ``ProcessGroup`` reachable from ``root`` through attributes, containers and bound methods' owners."""
    group_class = _process_group_class()
    found: dict[int, Any] = {}
    if group_class is None:
        return found
    seen: set[int] = set()
    stack: list[tuple[Any, int]] = [(root, 0)]
    while stack:
        obj, depth = stack.pop()
        if id(obj) in seen or depth > _SEARCH_DEPTH or isinstance(obj, (type, str, bytes, int, float)):
            continue
        seen.add(id(obj))
        if isinstance(obj, group_class):
            found[id(obj)] = obj
            continue
        if isinstance(obj, dict):
            children = list(obj.values())
        elif isinstance(obj, (list, tuple, set, frozenset)):
            children = list(obj)
        elif isinstance(obj, types.MethodType):
            children = [obj.__self__]
        elif isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType)):
            continue  # deepcopy shares functions and modules: what they hold is never copied
        else:  # a plain object, or a tensor's attributes (a quantized weight's quantizer holds its amax group)
            children = list(getattr(obj, "__dict__", {}).values())
            children += [getattr(obj, s) for s in getattr(type(obj), "__slots__", ()) if hasattr(obj, s)]
        # A module's submodules count as one level: a deep model must not run out of depth.
        next_depth = depth if isinstance(obj, torch.nn.Module) else depth + 1
        stack.extend((child, next_depth) for child in children)
    return found


def deepcopy_sharing_groups(obj: Any, memo: Optional[dict[int, Any]] = None) -> Any:
    """``copy.deepcopy(obj)`` in which every process group reachable from ``obj`` is shared, not pickled:
    a copy of a tensor-parallel op talks to the same ranks as the op."""
    memo = dict(memo or {})
    memo.update(_groups_reachable_from(obj))
    return copy.deepcopy(obj, memo)


# ------------------------------------------------------------------ FSDP2
def _fsdp_module_class() -> Optional[type]:
    import sys

    fsdp = sys.modules.get("torch.distributed.fsdp")
    return getattr(fsdp, "FSDPModule", None) if fsdp is not None else None


def _fsdp_modules(module: torch.nn.Module) -> list[torch.nn.Module]:
    fsdp_class = _fsdp_module_class()
    return [m for m in module.modules() if fsdp_class is not None and isinstance(m, fsdp_class)]


def is_fsdp_sharded(module: torch.nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` or to one of its submodules."""
    return bool(_fsdp_modules(module))


def _unsharded_values(fsdp_modules: list[torch.nn.Module]) -> dict[int, torch.nn.Parameter]:
    """``{id(sharded DTensor parameter): its unsharded value}``: what FSDP2's all-gather gives the forward
    (quantized shards gathered as their bytes and scales, so a twin computes with the reference's very bytes)."""
    out: dict[int, torch.nn.Parameter] = {}
    for m in fsdp_modules:
        sharded = {(id(owner), name): p for owner in m.modules() for name, p in owner._parameters.items()
                   if p is not None and is_dtensor(p)}
        if not sharded:
            continue
        m.unshard()
        try:
            for owner in m.modules():
                for name, p in owner._parameters.items():
                    before = sharded.get((id(owner), name))
                    if before is not None and id(before) not in out and not is_dtensor(p):
                        out[id(before)] = torch.nn.Parameter(p.detach().clone(), requires_grad=before.requires_grad)
        finally:
            m.reshard()
    return out


def _plain_class(module: torch.nn.Module) -> type:
    """The class ``fully_shard`` derived ``FSDP<Class>`` from (its first base that is not FSDP2's mixin)."""
    fsdp_class = _fsdp_module_class()
    return next(base for base in type(module).__mro__[1:] if not issubclass(base, fsdp_class))


@contextlib.contextmanager
def _plain_classes(modules: list[torch.nn.Module]) -> Iterator[None]:
    """The modules' FSDP2 classes swapped for their plain ones within the block (an ``FSDP<Class>`` refuses
    to be deep-copied)."""
    classes = [(m, type(m)) for m in modules]
    try:
        for m, _ in classes:
            m.__class__ = _plain_class(m)
        yield
    finally:
        for m, cls in classes:
            m.__class__ = cls


def _is_fsdp_hook(hook: Any) -> bool:
    owner = getattr(hook, "__self__", None)
    return (type(owner).__module__.startswith("torch.distributed.fsdp")
            or "_register_group_forward_hooks" in getattr(hook, "__qualname__", ""))


def single_process_copy(module: torch.nn.Module) -> torch.nn.Module:
    """A single-process copy of an FSDP2-sharded ``module``: each sharded parameter its unsharded value, no
    FSDP2 class, hook or state (a collective: every rank must call it)."""
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY

    fsdp_modules = _fsdp_modules(module)
    memo: dict[int, Any] = dict(_unsharded_values(fsdp_modules))
    for name, p in module.named_parameters():
        if is_dtensor(p) and id(p) not in memo:  # a DTensor FSDP2 does not manage (torch's tensor parallelism)
            memo[id(p)] = torch.nn.Parameter(full_value(p).clone(), requires_grad=p.requires_grad)
    for m in fsdp_modules:
        for key in (STATE_KEY, REGISTRY_KEY):
            if key in m.__dict__:
                memo[id(m.__dict__[key])] = OrderedDict()  # the copy is no FSDP2 module
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            for hook in hooks.values():
                if _is_fsdp_hook(hook):
                    memo[id(getattr(hook, "__self__", hook))] = getattr(hook, "__self__", hook)  # shared, then dropped
    with _plain_classes(fsdp_modules):
        twin = deepcopy_sharing_groups(module, memo)
    for m in twin.modules():
        for hooks in (m._forward_pre_hooks, m._forward_hooks):
            for key in [k for k, hook in hooks.items() if _is_fsdp_hook(hook)]:
                del hooks[key]
                m._forward_pre_hooks_with_kwargs.pop(key, None)
                m._forward_hooks_with_kwargs.pop(key, None)
                m._forward_hooks_always_called.pop(key, None)
        for flag in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            m.__dict__.pop(flag, None)
    return twin


def reduce_like_fsdp(reference: torch.nn.Module) -> Optional[Callable[[torch.nn.Module], None]]:
    """For the single-process twins of an FSDP2-sharded ``reference``: a function that reduces a twin's parameter
    grads in place as FSDP2 reduces the reference's (summed over the mesh, divided by the gradient divide factor,
    the mesh size by default); None when ``reference`` is not FSDP2-sharded."""
    fsdp_modules = _fsdp_modules(reference)
    if not fsdp_modules:
        return None
    meshes: dict[str, tuple[Any, float]] = {}
    for m in fsdp_modules:
        group = m._get_fsdp_state()._fsdp_param_group
        factor = getattr(group, "gradient_divide_factor", None) if group is not None else None
        prefix = next(n for n, sub in reference.named_modules() if sub is m)
        for name, p in m.named_parameters():
            if is_dtensor(p):
                full_name = f"{prefix}.{name}" if prefix else name
                meshes.setdefault(full_name, (p.device_mesh, factor or float(p.device_mesh.size())))

    def reduce(twin: torch.nn.Module) -> None:
        with torch.no_grad():
            for name, p in twin.named_parameters():
                if p.grad is None or name not in meshes:
                    continue
                mesh, factor = meshes[name]
                for dim in range(mesh.ndim):
                    torch.distributed.all_reduce(p.grad, group=mesh.get_group(dim))
                p.grad.div_(factor)

    return reduce


def twin_source(reference: torch.nn.Module) -> torch.nn.Module:
    """What the reference's twins are copied from: a single-process copy of an FSDP2-sharded reference, the
    reference itself otherwise (a tensor-parallel one's twins share its process group)."""
    return single_process_copy(reference) if is_fsdp_sharded(reference) else reference


def reduce_twin_grads_like(reference: torch.nn.Module, twin_sides: list[Any]) -> None:
    """Every twin side of an FSDP2-sharded ``reference`` reduces its grads after each backward as FSDP2 does."""
    reduce = reduce_like_fsdp(reference)
    for side in twin_sides:
        side.after_backward = reduce


def reshard_after_no_grad_forward(module: torch.nn.Module) -> None:
    """Reshard every FSDP2 module of ``module`` after a forward under ``no_grad`` (the eval forward).

    FSDP2 (seen with torch 2.13 on gloo, plain ``torch.nn.Linear`` too) leaves the root's parameters unsharded
    after a forward under ``no_grad``, and the next backward then sums the grads over the ranks instead of
    averaging them; after an explicit ``reshard()`` it averages again. The script's eval forward is meant to
    change nothing, so an FSDP2 side is resharded after it, as a training loop's next step would find it.
    """
    for m in reversed(_fsdp_modules(module)):
        m.reshard()
