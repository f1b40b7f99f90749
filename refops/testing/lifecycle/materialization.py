"""Lifecycle properties of deferred initialization: from ``meta`` to real, initialized parameters.

Each check takes a :class:`~refops.testing.lifecycle.probe.Subject` and returns
its evidence when the property holds, or raises ``Violation``, ``NotApplicable``
or ``NotChecked`` (see :mod:`refops.testing.lifecycle.probe`). The materialized
module is always compared with the module built directly on the target device
under the same seed: values must be bit-identical, as
``docs/lifecycle.md#the-states-of-a-parameter`` promises.
"""

from __future__ import annotations

from typing import Any

import torch

from .evidence import (
    alias_changes,
    alias_structure,
    compare_tensors,
    describe_aliases,
    describe_exception,
    grads,
    named_tensors,
    output_tensors,
    plural,
    quantization_state,
    storage_keys,
    weighted_sum,
)
from .probe import PATHS, NotApplicable, NotChecked, Subject, Violation, is_refops_module, over_paths

__all__ = [
    "held_state",
    "zero_allocation_on_meta",
    "materializable_from_meta",
    "eager_values_after_reset_parameters",
    "eager_values_after_to_empty",
    "eager_values_after_first_forward",
    "identity_through_materialization",
    "aliases_preserved",
    "requires_grad_kept",
]


def zero_allocation_on_meta(s: Subject) -> str:
    """Built on ``meta``, every parameter and buffer is a meta tensor and no device memory goes to them.

    The contract (``docs/lifecycle.md``: "shape and dtype only, no storage") is about the
    model's tensors, whose size is the model's: a meta build lets a large model allocate
    nothing until it is sharded or placed. A quantized op's recipe state (delayed
    scaling's amax history and scales, a few KiB per op) is not a parameter: TE and refops
    both create it at construction under ``quantized_model_init``, on the device the op
    will run on. Bytes held by such tensors are named in the evidence, not counted as a
    violation; any other byte allocated during construction is.
    """
    measured = s.device.type in MEASURED_DEVICE_TYPES
    before = _bytes_ever_allocated(s.device) if measured else 0
    module = s.meta()
    allocated = _bytes_ever_allocated(s.device) - before if measured else 0
    params, buffers = dict(module.named_parameters()), dict(module.named_buffers())
    if not params and not buffers:
        raise NotApplicable("the module has no parameters or buffers")
    real = sorted(f"{name} ({t.device})" for name, t in {**params, **buffers}.items() if not t.is_meta)
    problems = [f"not on meta: {', '.join(real)}"] if real else []
    state = held_state(module, s.device) if allocated else {}
    explained = sum(_allocator_bytes(t) for t in state.values())
    if allocated > explained:
        held = f", of which {explained} are held outside parameters and buffers ({_names(state)})" if state else ""
        problems.append(f"construction allocated {allocated} bytes on {s.device}{held}")
    if problems:
        raise Violation("; ".join(problems))
    memory = ""
    if measured:
        memory = f"; no bytes allocated on {s.device} meanwhile"
        if allocated:
            memory = (f"; the {allocated} bytes allocated on {s.device} meanwhile are state held outside parameters "
                      f"and buffers ({_names(state)}), not parameter storage")
    return f"all {plural(len(params), 'parameter')} and {plural(len(buffers), 'buffer')} are meta{memory}"


def materializable_from_meta(s: Subject) -> str:
    """A meta-built module can be initialized: ``reset_parameters()``, ``to_empty()`` + ``reset_parameters()`` or
    its first forward leaves no tensor on meta.

    Deferred initialization is what building on meta is for. A module with no ``reset_parameters()`` (on
    itself or its children) whose forward on a meta-built module raises, or leaves tensors on meta, can be
    built on meta but never used: that is a violation, not a convention that does not apply.
    """
    tried = []
    for path in ("reset_parameters", "to_empty", "first_forward"):
        try:
            module = s.meta()
        except Exception as error:  # noqa: BLE001  (a factory that cannot build on meta is evidence)
            raise Violation(f"factory(meta) raised {describe_exception(error)}") from error
        if not named_tensors(module):
            raise NotApplicable("the module has no parameters or buffers")
        try:
            args = s.fresh_inputs() if path == "first_forward" else ()
            outputs = s.materialize(module, path, args)
        except (Violation, NotApplicable) as error:
            tried.append(f"{path}: {error}")
            continue
        except NotChecked as error:
            raise NotChecked(f"{'; '.join(tried)}; first_forward: {error}") from error
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            tried.append(f"{path}: raised {describe_exception(error)}")
            continue
        del outputs
        if path == "reset_parameters":
            return f"{PATHS[path]} leaves no tensor on meta"
        return f"{PATHS[path]} leaves no tensor on meta (not through {', '.join(t.split(':')[0] for t in tried)})"
    raise Violation("a meta-built module cannot be initialized: " + "; ".join(tried))


def held_state(module: torch.nn.Module, device: torch.device, depth: int = 5) -> dict[str, torch.Tensor]:
    """Tensors on ``device`` that ``module`` holds outside its parameters and buffers, by attribute path
    (``"basic_ops.0._recipe_states['forward'].amax_history"``), each storage once.

    Found by walking the attributes of every submodule, through dicts, lists and plain
    objects (recipe states, quantizers), ``depth`` levels deep.
    """
    found: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    storages: set[tuple] = set()

    def visit(value: Any, path: str, level: int) -> None:
        if id(value) in seen or level > depth:
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            inner = quantization_state(value)[1]
            if inner:  # a quantized tensor: its bytes are in its inner tensors
                for name, item in inner.items():
                    visit(item, f"{path}.{name}", level + 1)
            elif value.device == device and storage_keys(value) - storages:
                storages.update(storage_keys(value))
                found[path] = value
            return
        if isinstance(value, torch.nn.Module):
            return  # submodules are walked from module.named_modules()
        if isinstance(value, dict):
            for key, item in value.items():
                visit(item, f"{path}[{key!r}]", level + 1)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(item, f"{path}[{i}]", level + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type):
            for key, item in vars(value).items():
                visit(item, f"{path}.{key}", level + 1)

    for prefix, sub in module.named_modules():
        for key, value in vars(sub).items():
            if key not in ("_parameters", "_buffers", "_modules"):
                visit(value, f"{prefix}.{key}" if prefix else key, 1)
    return found


def _allocator_bytes(t: torch.Tensor) -> int:
    """What the CUDA caching allocator counts for ``t``'s storage: its size rounded up to 512 bytes."""
    return -(-t.untyped_storage().nbytes() // 512) * 512


def _names(state: dict[str, torch.Tensor]) -> str:
    shown = [f"{path} {tuple(t.shape)}" for path, t in list(state.items())[:4]]
    more = f", and {len(state) - 4} more" if len(state) > 4 else ""
    return ", ".join(shown) + more


#: The device types whose allocations construction is measured on (CPU allocations are not counted).
MEASURED_DEVICE_TYPES = ("cuda",)


def _bytes_ever_allocated(device: torch.device) -> int:
    """The caching allocator's running total of bytes allocated on ``device``: frees never lower it.

    Not ``memory_allocated``, the bytes live now: a garbage collection that frees an earlier test's
    tensors during construction would lower that and hide (or, as a negative count, fake) an allocation.
    """
    return int(torch.cuda.memory_stats(device).get("allocated_bytes.all.allocated", 0))


def _eager_values(s: Subject, path: str) -> str:
    eager = s.eager()
    module = s.meta()
    if not named_tensors(module):
        raise NotApplicable("the module has no parameters or buffers")
    ids = {name: id(p) for name, p in module.named_parameters()}
    s.materialize(module, path)
    problems = compare_tensors(named_tensors(module), named_tensors(eager), device=s.device)
    if problems:
        raise Violation(f"after {path}: " + "; ".join(problems))
    replaced = sorted(name for name, p in module.named_parameters() if ids.get(name) != id(p))
    note = ""
    if replaced and path == "to_empty":
        note = f"; to_empty replaced the objects of {', '.join(replaced)} (PyTorch's semantics)"
    return f"{plural(len(named_tensors(module)), 'tensor')} bit-identical to eager construction on {s.device}{note}"


def eager_values_after_reset_parameters(s: Subject) -> str:
    """``reset_parameters()`` on the meta-built module gives the eager module's values, on the device."""
    return _eager_values(s, "reset_parameters")


def eager_values_after_to_empty(s: Subject) -> str:
    """``to_empty(device)`` then ``reset_parameters()`` gives the eager module's values."""
    return _eager_values(s, "to_empty")


def eager_values_after_first_forward(s: Subject) -> str:
    """The first forward materializes: parameters, outputs and grads equal the eager module's.

    A refops extension (refops' ops materialize at the first forward, as TE's do through
    ``pre_first_fuser_forward``; PyTorch modules do not), unless the module claims it
    (``materializes_at_first_forward=True``): then it is a promise of that module.
    """
    args = s.fresh_inputs()
    probe = s.meta()
    if not named_tensors(probe):
        raise NotApplicable("the module has no parameters or buffers")
    eager = s.eager()
    eager_outputs = s.forward_backward(eager, args)
    module = s.meta()
    try:
        outputs = s.materialize(module, "first_forward", s.fresh_inputs())
    except NotApplicable as error:  # the module does not materialize by itself: the extension is not kept
        raise Violation(str(error)) from error
    loss = weighted_sum(outputs)
    try:
        if loss is not None:
            loss.backward()
    except Exception as error:  # noqa: BLE001  (the seed's bug surfaces here)
        raise Violation(f"backward after the first forward raised {describe_exception(error)}") from error
    problems = compare_tensors(named_tensors(module), named_tensors(eager), what="tensor", device=s.device)
    problems += compare_tensors(
        {f"#{i}": y.detach() for i, y in enumerate(outputs)}, {f"#{i}": y for i, y in enumerate(eager_outputs)},
        what="output",
    )
    problems += compare_tensors(grads(module), grads(eager), what="grad of", device=s.device)
    if problems:
        raise Violation("; ".join(problems))
    return f"parameters, {plural(len(outputs), 'output')} and grads bit-identical to eager construction"


#: Why ``identity_through_materialization`` is an extension, said when a module that is not refops' does not keep it.
REFOPS_EXTENSION = (
    "PyTorch and TE do not promise that materializing keeps parameter objects: build the optimizer after "
    "materializing"
)


def identity_through_materialization(s: Subject) -> str:
    """Materializing in place keeps every parameter object, so an optimizer built before holds the live ones.

    A refops extension (``docs/lifecycle.md``): PyTorch does not promise it (``to_empty()`` makes new objects),
    nor does TransformerEngine (its ``reset_parameters()`` wraps new values in a new ``Parameter``). Not kept,
    the evidence says what an optimizer built before materializing holds, and, for a module that is not refops',
    :data:`REFOPS_EXTENSION`.
    """

    def check(path: str) -> str:
        module = s.meta()
        before = dict(module.named_parameters())
        if not before:
            raise NotApplicable("the module has no parameters")
        optimizer = torch.optim.SGD(module.parameters(), lr=0.0)
        args = s.fresh_inputs() if path == "first_forward" else ()
        s.materialize(module, path, args)
        after = dict(module.named_parameters())
        replaced = [f"{n} (id {id(p):#x} -> {id(after.get(n)):#x})" for n, p in before.items() if after.get(n) is not p]
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        orphaned = sorted(n for n, p in after.items() if id(p) not in held)
        problems = [f"replaced {', '.join(replaced)}"] if replaced else []
        if orphaned:
            problems.append(f"the optimizer built before holds stale objects for {', '.join(orphaned)}")
        if problems:
            raise Violation("; ".join(problems))
        return f"{plural(len(before), 'parameter id')} unchanged, the optimizer built before holds them"

    try:
        return over_paths(["reset_parameters", "first_forward"], check)
    except Violation as error:
        why = "" if is_refops_module(s.meta()) else f" ({REFOPS_EXTENSION})"
        raise Violation(f"{error}{why}") from error
    except NotApplicable as error:
        if not list(s.meta().parameters()):
            raise
        raise NotApplicable(
            f"{error}. The module has no in-place materialization path; its to_empty() creates new "
            "parameter objects by PyTorch's definition (build optimizers after materializing)"
        ) from error


def aliases_preserved(s: Subject) -> str:
    """Names that share a tensor keep sharing it, and no new sharing appears, through every materialization."""

    def check(path: str) -> str:
        module = s.meta()
        if not named_tensors(module):
            raise NotApplicable("the module has no parameters or buffers")
        before = alias_structure(module)
        args = s.fresh_inputs() if path == "first_forward" else ()
        s.materialize(module, path, args)
        changes = alias_changes(before, alias_structure(module))
        if changes:
            raise Violation("; ".join(changes))
        return f"kept ({describe_aliases(before)})"

    return over_paths(["reset_parameters", "to_empty", "first_forward"], check)


def parameters_to_freeze(module: torch.nn.Module) -> list[str]:
    """The parameters owned by the first module that owns some itself (not as an alias of a child's).

    Freezing a whole owner keeps ops valid whose parameters must agree on
    ``requires_grad`` (``GroupedLinear``).
    """
    for prefix, sub in module.named_modules():
        inherited = {id(p) for child in sub.children() for p in child.parameters()}
        own = [name for name, p in sub.named_parameters(recurse=False) if id(p) not in inherited]
        if own:
            return [f"{prefix}.{name}" if prefix else name for name in own]
    return []


def requires_grad_kept(s: Subject) -> str:
    """``requires_grad=False`` set on a meta parameter survives materialization; that parameter gets no grad."""

    def check(path: str) -> str:
        module = s.meta()
        frozen = parameters_to_freeze(module)
        if not frozen:
            raise NotApplicable("the module has no parameters")
        named = dict(module.named_parameters(remove_duplicate=False))
        for name in frozen:
            named[name].requires_grad_(False)
        args = s.fresh_inputs(input_requires_grad=True) if path == "first_forward" else ()
        outputs = s.materialize(module, path, args)
        if path != "first_forward" and s.inputs is not None:
            outputs = output_tensors(module(*s.fresh_inputs(input_requires_grad=True)))
        loss = weighted_sum(outputs)
        try:
            if loss is not None:
                loss.backward()
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            raise Violation(f"backward raised {describe_exception(error)}") from error
        named = dict(module.named_parameters(remove_duplicate=False))
        flipped = [n for n in frozen if named[n].requires_grad]
        problems = [f"requires_grad became True on {', '.join(flipped)}"] if flipped else []
        got_grad = [n for n in frozen if named[n].grad is not None]
        if got_grad:
            problems.append(f"frozen {', '.join(got_grad)} received a grad")
        if loss is not None:
            missing = sorted(n for n, p in module.named_parameters() if p.requires_grad and p.grad is None)
            if missing:
                problems.append(f"trainable {', '.join(missing)} received no grad")
        if problems:
            raise Violation("; ".join(problems))
        ran = " and received no grad" if loss is not None else ""
        return f"{', '.join(frozen)} stayed frozen{ran}"

    return over_paths(["reset_parameters", "to_empty", "first_forward"], check)

