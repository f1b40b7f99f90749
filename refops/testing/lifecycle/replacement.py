"""Lifecycle properties of parameter replacement: assignment, loading and copying.

Every check here swaps parameter objects under a module that has already run
(or could run) a forward, and then asks whether the module still computes with,
and puts grads on, the objects that ``named_parameters()`` reports. This is the
class of bug refops exists for: TransformerEngine's fuser cached its parameter
list once, so after materialization replaced the objects, grads went to stale
meta tensors (TE issue 3322).
"""

from __future__ import annotations

import copy

import torch

from .evidence import (
    alias_changes,
    alias_structure,
    bit_equal,
    compare_tensors,
    describe_aliases,
    describe_exception,
    grads,
    max_difference,
    named_tensors,
    plural,
    quantization_differences,
    storage_keys,
)
from .materialization import parameters_to_freeze
from .probe import NotApplicable, Subject, Violation
from .steps import run_step, trainable

__all__ = [
    "no_stale_cache_after_replacement",
    "load_state_dict_assign_into_meta",
    "deepcopy_keeps_aliases_and_shares_nothing",
]


def _replacement_targets(module: torch.nn.Module, deepest: bool) -> list[tuple[str, str, torch.nn.Parameter]]:
    """``(first name, name to replace through, parameter)`` for every parameter object.

    The first name is the one ``named_parameters()`` reports (for a container, its
    alias); the deepest is the owner's own name (``basic_ops.0.weight``).
    """
    groups: dict[int, list[str]] = {}
    objects: dict[int, torch.nn.Parameter] = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        groups.setdefault(id(p), []).append(name)
        objects[id(p)] = p
    targets = []
    for key, names in groups.items():
        through = max(reversed(names), key=lambda n: n.count(".")) if deepest else names[0]
        targets.append((names[0], through, objects[key]))
    return targets


def _assign(module: torch.nn.Module, path: str, new: torch.nn.Parameter, how: str) -> None:
    owner_path, _, leaf = path.rpartition(".")
    owner = module.get_submodule(owner_path)
    if how == "setattr":
        setattr(owner, leaf, new)
    else:
        owner.register_parameter(leaf, new)


def _names_of(module: torch.nn.Module, obj: torch.Tensor) -> list[str]:
    return [n for n, p in module.named_parameters(remove_duplicate=False) if p is obj]


def _replace(module: torch.nn.Module, how: str) -> tuple[list[tuple[str, str, torch.nn.Parameter, torch.nn.Parameter]],
                                                        list[str]]:
    """Replace every parameter by a new object with the same values.

    Returns ``(name, through, old, new)`` per object, and the names re-tied: a tied weight
    (one object under independent names, ``decoder.weight = encoder.weight``) is replaced
    through one name, then every name still holding the old object is pointed at the new one,
    as a user re-ties after replacing. Names a container keeps in sync itself follow on their own.
    """
    replaced, retied = [], []
    for name, through, old in _replacement_targets(module, deepest=how == "register_parameter"):
        new = torch.nn.Parameter(old.detach().clone(), requires_grad=old.requires_grad)
        _assign(module, through, new, how)
        while _names_of(module, old):  # one name at a time: re-tying a container alias may move others
            other = _names_of(module, old)[0]
            _assign(module, other, new, how)
            retied.append(other)
        replaced.append((name, through, old, new))
    return replaced, retied


def no_stale_cache_after_replacement(s: Subject) -> str:
    """After a first forward, parameters replaced by ``setattr`` or ``register_parameter`` get the grads."""
    module = s.eager()
    trainable(module)
    # The control: the same module rebuilt under the same seed, run for the same steps, never replaced. A module
    # with state that moves between steps (delayed scaling's amax history) computes different grads at each
    # step, correctly; only a difference from the twin at the same step is the replacement's doing.
    twin = s.eager()
    run_step(s, module, "before replacement")
    run_step(s, twin, "of the untouched twin")
    differs = _differing_grads(module, twin)
    notes = []
    if differs:
        # Two builds under one seed that do not agree at the first step: the twin is no control. The checks on
        # which object gets the grad still stand; the grads' values are not compared.
        twin = None
        notes.append(f"grad values not compared: a second build under the same seed computed other grads at the "
                     f"first step ({', '.join(differs)})")
    problems, done = [], []
    for how in ("setattr", "register_parameter"):
        module.zero_grad(set_to_none=True)
        replaced, retied = _replace(module, how)
        if retied:
            notes.append(f"re-tied {', '.join(retied)} after {how}")
        try:
            run_step(s, module, f"after {how}")
        except Violation as error:
            problems.append(str(error))
            continue
        expected = {}
        if twin is not None:
            twin.zero_grad(set_to_none=True)
            run_step(s, twin, f"of the untouched twin, step of {how}")
            expected = {name: p.grad for name, p in twin.named_parameters(remove_duplicate=False)
                        if p.grad is not None}
        current = dict(module.named_parameters())
        for name, through, old, new in replaced:
            if current.get(name) is not new:
                problems.append(f"after {how}({through}), {name} still names the old object")
            still_named = _names_of(module, old)
            if still_named:
                # The module keeps the old object under another name (a tie it re-made itself): that
                # object may rightly get a grad, and the new one's grad is only its share.
                notes.append(f"the old {name} is still {', '.join(still_named)} after {how}")
                continue
            if new.requires_grad and new.grad is None:
                problems.append(f"after {how}({through}) the new {name} got no grad")
            elif new.grad is not None and name in expected and not bit_equal(new.grad, expected[name]):
                diff = max_difference(new.grad, expected[name])
                problems.append(f"after {how}({through}) the grad of {name} differs from the untouched twin's "
                                f"(max |diff| {diff})")
            if old.grad is not None:
                problems.append(f"after {how}({through}) the replaced {name} (id {id(old):#x}) got a grad")
            changed = quantization_differences(new, old)  # the forward must use it as given: not dequantize it
            if changed:
                problems.append(f"after {how}({through}) and a forward, the new {name} " + "; ".join(changed))
        done.append(f"{how}({', '.join(through for _, through, _, _ in replaced)})")
    if problems:
        raise Violation("; ".join(problems))
    note = f" ({'; '.join(notes)})" if notes else ""
    compared = "" if twin is None else ", equal to an untouched twin's at the same step"
    return f"grads landed on the new parameters only{compared}, after {' and '.join(done)}{note}"


def _differing_grads(module: torch.nn.Module, twin: torch.nn.Module) -> list[str]:
    """The parameters whose grads differ between ``module`` and ``twin`` (same structure), with the difference."""
    mine, theirs = grads(module), grads(twin)
    out = []
    for name in sorted(set(mine) | set(theirs)):
        a, b = mine.get(name), theirs.get(name)
        if (a is None) != (b is None):
            out.append(f"{name}: grad on one build only")
        elif a is not None and not bit_equal(a, b):
            out.append(f"{name} (max |diff| {max_difference(a, b)})")
    return out


def load_state_dict_assign_into_meta(s: Subject) -> str:
    """``load_state_dict(state, assign=True)`` into a meta-built module materializes it, keeps aliases, and keeps
    each parameter's ``requires_grad`` as the module set it (checked on a second meta-built module with one owner
    frozen before the load: the checkpoint's plain tensors carry no flag, and the module's must win)."""
    source = s.eager(seed_offset=1)
    trainable(source)
    state = _clone_keeping_ties(source.state_dict())
    module = s.meta()
    before = alias_structure(module)
    _load_assigning(module, state)
    problems = compare_tensors(named_tensors(module), named_tensors(source), what="tensor", device=s.device)
    problems += alias_changes(before, alias_structure(module))
    # Another meta-built module with one owner frozen (all trainable above, so that every grad is checked there).
    frozen_module = s.meta()
    frozen = parameters_to_freeze(frozen_module)
    named = dict(frozen_module.named_parameters(remove_duplicate=False))
    for name in frozen:
        named[name].requires_grad_(False)
    _load_assigning(frozen_module, state)
    loaded = dict(frozen_module.named_parameters(remove_duplicate=False))
    thawed = [name for name in frozen if name in loaded and loaded[name].requires_grad]
    if thawed:
        problems.append(f"requires_grad became True on the frozen {', '.join(thawed)}")
    ran = ""
    if s.inputs is not None:
        outputs = run_step(s, module, "after loading")
        expected = run_step(s, source, "of the source")
        problems += compare_tensors(outputs, expected, what="output")
        problems += compare_tensors(grads(module), grads(source), what="grad of", device=s.device)
        ran = "; forward and backward match the source and grads land on the loaded parameters"
    if problems:
        raise Violation("; ".join(problems))
    kept = f"; {', '.join(frozen)} stayed frozen" if frozen else ""
    return (f"{plural(len(named_tensors(module)), 'tensor')} loaded bit-identically; {describe_aliases(before)}"
            f"{kept}{ran}")


def _load_assigning(module: torch.nn.Module, state: dict) -> None:
    try:
        module.load_state_dict(state, assign=True)
    except Exception as error:  # noqa: BLE001
        raise Violation(f"load_state_dict(assign=True) raised {describe_exception(error)}") from error


def _clone_keeping_ties(state: dict) -> dict:
    """A deep copy of a state dict in which entries that were one tensor (tied weights) stay one tensor."""
    clones: dict[int, torch.Tensor] = {}
    out = {}
    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            value = clones.setdefault(id(value), value.detach().clone())
        out[key] = value
    return out


def deepcopy_keeps_aliases_and_shares_nothing(s: Subject) -> str:
    """``copy.deepcopy`` keeps the alias structure and shares no tensor object or storage with the original."""
    module = s.eager()
    if not named_tensors(module):
        raise NotApplicable("the module has no parameters or buffers")
    if s.inputs is not None:
        run_step(s, module, "of the original")
        module.zero_grad(set_to_none=True)
    clone = copy.deepcopy(module)
    problems = alias_changes(alias_structure(module), alias_structure(clone))
    originals, copies = named_tensors(module), named_tensors(clone)
    shared = sorted(n for n, t in copies.items() if any(t is o for o in originals.values()))
    if shared:
        problems.append(f"the copy shares the objects of {', '.join(shared)}")
    storages = set().union(*(storage_keys(t) for t in originals.values()))
    shared_storage = sorted(n for n, t in copies.items() if storage_keys(t) & storages)
    if shared_storage:
        problems.append(f"the copy shares the storage of {', '.join(shared_storage)}")
    problems += compare_tensors(copies, originals, what="copied tensor")
    ran = ""
    if s.inputs is not None:
        outputs = run_step(s, clone, "of the copy")
        expected = run_step(s, module, "of the original", backward=False)
        problems += compare_tensors(outputs, expected, what="output")
        missing = sorted(n for n, p in clone.named_parameters() if p.requires_grad and p.grad is None)
        leaked = sorted(n for n, p in module.named_parameters() if p.grad is not None)
        if missing:
            problems.append(f"the copy's {', '.join(missing)} got no grad")
        if leaked:
            problems.append(f"backward through the copy put grads on the original's {', '.join(leaked)}")
        ran = "; backward through the copy puts grads on the copy only"
    if problems:
        raise Violation("; ".join(problems))
    return f"{plural(len(copies), 'tensor')} copied, none shared; {describe_aliases(alias_structure(clone))}{ran}"
