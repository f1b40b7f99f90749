"""What the lifecycle checks share: the module under test, its materialization paths, their outcomes.

A :class:`Subject` holds the factory ``f(device) -> torch.nn.Module``, the
target device, the forward inputs, the seed, what the module claims about how
it materializes, and the caller's module conversion. A module built on
``meta`` can be materialized along three paths:

* ``reset_parameters``: ``module.reset_parameters()`` alone (TE's and refops' explicit entry point);
* ``to_empty``: ``module.to_empty(device=d)`` then ``module.reset_parameters()``
  (PyTorch's convention, which every module is expected to follow);
* ``first_forward``: calling the module on real inputs (refops' lazy path, like
  ``pre_first_fuser_forward`` in TransformerEngine).

``to_empty`` is always required. ``reset_parameters`` is required of a module that
claims it (``materializes_through_reset_parameters``): a refops or TE module, or one
whose ``reset_parameters()`` on a meta-built module moves at least one tensor off
meta; a claim half kept (some tensors left on meta) is a violation. A plain
``torch.nn.Linear``, whose ``reset_parameters()`` leaves every tensor on meta (it
initializes whatever storage it has, and under PyTorch's convention ``to_empty()``
gives it storage first), makes no claim: the path is not applicable. The
``first_forward`` path is required only when claimed (``materializes_at_first_forward``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from .evidence import describe_exception, named_tensors, output_tensors, weighted_sum

__all__ = ["Subject", "Violation", "NotApplicable", "NotChecked", "PATHS", "over_paths", "reset_roots",
           "named_reset_roots", "is_refops_module", "is_te_module", "follows_te_contract", "meta_names"]

#: The materialization paths, and how the evidence names them.
PATHS: dict[str, str] = {
    "reset_parameters": "reset_parameters() on the meta-built module (or on each child, for a composite)",
    "to_empty": "to_empty() + reset_parameters() on the meta-built module",
    "first_forward": "the first forward of the meta-built module",
}

#: What the evidence says when a module follows PyTorch's convention rather than materializing by itself.
PYTORCH_CONVENTION = "PyTorch's convention: materialize with to_empty() first"


class Violation(Exception):
    """The property does not hold; the message is the evidence."""


class NotApplicable(Exception):
    """The property (or one path of it) does not apply; the message says why."""


class NotChecked(Exception):
    """The property needs something that was not given (forward inputs, a conversion); the message says what."""


@dataclasses.dataclass
class Subject:
    """The module factory under test and everything needed to exercise it."""

    #: Builds the module on the device it is given.
    factory: Callable[[torch.device], torch.nn.Module]
    #: The real device to materialize on.
    device: torch.device
    #: The forward arguments, drawn once; every run gets fresh clones.
    inputs: Optional[tuple[Any, ...]]
    #: The RNG seed used before every construction and materialization.
    seed: int
    #: Whether ``reset_parameters()`` on the meta-built module must materialize it: True (claimed), False
    #: (PyTorch's to_empty() convention: observed, never required) or None (claimed by each reset root that
    #: is a refops or TE module, or that moves at least one tensor off meta).
    through_reset_parameters: Optional[bool] = None
    #: Whether the module claims to materialize at its first forward (then failing to is a violation).
    at_first_forward: bool = False
    #: The caller's module conversion, ``convert(module) -> module`` (None: not given).
    convert: Optional[Callable[[torch.nn.Module], Optional[torch.nn.Module]]] = None

    # ----------------------------------------------------------- construction
    def build(self, device: torch.device | str, seed: Optional[int] = None) -> torch.nn.Module:
        """The factory's module on ``device``, built right after seeding with ``seed`` (when given)."""
        if seed is not None:
            torch.manual_seed(seed)
        return self.factory(torch.device(device))

    def eager(self, seed_offset: int = 0) -> torch.nn.Module:
        """The module built directly on the target device under ``seed + seed_offset``."""
        return self.build(self.device, self.seed + seed_offset)

    def meta(self) -> torch.nn.Module:
        """The module built on ``meta`` (no seeding: construction on meta draws no random numbers)."""
        return self.build("meta")

    # ---------------------------------------------------------------- running
    def fresh_inputs(self, *, input_requires_grad: bool = False, scale: float = 1.0) -> tuple[Any, ...]:
        """Clones of the inputs, floating-point ones times ``scale``; optionally the first of them requires grad."""
        if self.inputs is None:
            raise NotChecked("needs inputs=... to run forward and backward")
        args, marked = [], False
        for arg in self.inputs:
            if isinstance(arg, torch.Tensor):
                arg = arg.detach().clone()
                if scale != 1.0 and arg.is_floating_point():
                    arg = arg * scale
                if input_requires_grad and not marked and arg.is_floating_point():
                    arg.requires_grad_(True)
                    marked = True
            args.append(arg)
        return tuple(args)

    def forward_backward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> list[torch.Tensor]:
        """Run forward, then backward of a fixed weighting of the outputs when any requires grad.

        Returns the detached floating-point outputs.
        """
        outputs = output_tensors(module(*args))
        loss = weighted_sum(outputs)
        if loss is not None:
            loss.backward()
        return [t.detach() for t in outputs]

    def materialize(self, module: torch.nn.Module, path: str, args: tuple[Any, ...] = ()) -> list[torch.Tensor]:
        """Materialize the meta-built ``module`` along ``path`` after seeding.

        Returns the outputs of the first forward, still attached to the autograd
        graph (an empty list for the other paths); the caller runs backward.

        Raises:
            Violation: the path is required (see the module docstring) and it raised or left tensors on meta.
            NotApplicable: the module does not use this path.
        """
        if path == "first_forward":
            torch.manual_seed(self.seed)
            return self._first_forward(module, args)
        name = type(module).__name__
        roots = named_reset_roots(module)
        if not roots:
            raise NotApplicable(f"neither {name} nor any of its submodules defines reset_parameters()")
        if _shared_across([root for _, root in roots]):
            raise NotApplicable(
                f"{name} defines no reset_parameters() and its children share parameters (tied weights): "
                "resetting each child would initialize a shared parameter twice; define reset_parameters() "
                f"on {name} to reset and re-tie"
            )
        torch.manual_seed(self.seed)
        if path == "to_empty":
            try:
                module.to_empty(device=self.device)
                for _, root in roots:
                    root.reset_parameters()
            except Exception as error:  # noqa: BLE001  (any failure is evidence)
                raise Violation(f"{PATHS[path]} raised {describe_exception(error)}") from error
            left = sorted(meta_names(module))
            if left:
                raise Violation(f"{PATHS[path]} left {', '.join(left)} on meta")
            return []
        self._reset_parameters(module, roots)
        return []

    def _reset_parameters(self, module: torch.nn.Module, roots: list[tuple[str, torch.nn.Module]]) -> None:
        """``reset_parameters()`` on each reset root, judged root by root: a root that claims to materialize
        (see the module docstring) must leave nothing on meta; one that makes no claim follows PyTorch."""
        name = type(module).__name__
        before = meta_names(module)
        errors: dict[str, BaseException] = {}
        for prefix, root in roots:
            try:
                root.reset_parameters()
            except Exception as error:  # noqa: BLE001  (any failure is evidence)
                errors[prefix] = error
        after = meta_names(module)
        problems, unclaimed, refused = [], [], []
        for prefix, root in roots:
            where = PATHS["reset_parameters"] if root is module else f"reset_parameters() of {prefix}"
            mine = {n for n in before | after if _under(n, prefix)}
            left, moved = sorted(mine & after), sorted((mine & before) - after)
            claim = self._claims_reset(root, moved)
            if prefix in errors:
                said = f"{where} raised {describe_exception(errors[prefix])}"
                (problems if claim else refused).append(said)
            elif left and not claim:
                unclaimed.extend(left)
            elif left and moved and self.through_reset_parameters is None and not follows_te_contract(root):
                problems.append(f"{where} moved {', '.join(moved)} off meta but left {', '.join(left)} on meta: a "
                                "partial materialization (a reset_parameters() that materializes must leave "
                                "nothing on meta)")
            elif left:
                problems.append(f"{where} left {', '.join(left)} on meta")
        uncovered = sorted(n for n in after if not any(_under(n, prefix) for prefix, _ in roots))
        if uncovered and self.through_reset_parameters:
            problems.append(f"{PATHS['reset_parameters']} left {', '.join(uncovered)} on meta (no reset_parameters() "
                            "covers them)")
        unclaimed.extend(uncovered)
        if problems:
            raise Violation("; ".join(problems))
        if refused:
            raise NotApplicable(f"{name} does not materialize through {'; '.join(refused)}; PyTorch modules "
                                "materialize through to_empty()")
        if unclaimed:
            which = "every tensor" if set(unclaimed) == set(named_tensors(module)) else ", ".join(sorted(unclaimed))
            raise NotApplicable(f"{PATHS['reset_parameters']} leaves {which} of {name} on meta ({PYTORCH_CONVENTION})")

    def _claims_reset(self, root: torch.nn.Module, moved: list[str]) -> bool:
        """Whether ``root.reset_parameters()`` claims to materialize a meta-built module."""
        if self.through_reset_parameters is not None:
            return self.through_reset_parameters
        return bool(moved) or follows_te_contract(root)

    def _first_forward(self, module: torch.nn.Module, args: tuple[Any, ...]) -> list[torch.Tensor]:
        name = type(module).__name__
        before = meta_names(module)
        try:
            outputs = output_tensors(module(*args))
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            if self.at_first_forward:
                raise Violation(f"{PATHS['first_forward']} raised {describe_exception(error)}") from error
            raise NotApplicable(
                f"{name} does not materialize through {PATHS['first_forward']} (it raised "
                f"{describe_exception(error)}); PyTorch modules materialize through to_empty()"
            ) from error
        left = sorted(meta_names(module))
        if left and self.at_first_forward:
            raise Violation(f"{PATHS['first_forward']} left {', '.join(left)} on meta")
        if left:
            moved = sorted(before - set(left))
            which = "every tensor" if len(left) == len(named_tensors(module)) else ", ".join(left)
            partly = f" (it moved {', '.join(moved)} off meta)" if moved else ""
            raise NotApplicable(f"{PATHS['first_forward']} leaves {which} of {name} on meta{partly} "
                                f"({PYTORCH_CONVENTION})")
        return outputs


def meta_names(module: torch.nn.Module) -> set[str]:
    """The names (first name of each object) of the parameters and buffers of ``module`` that are on meta."""
    return {n for n, t in named_tensors(module).items() if t.is_meta}


def _under(name: str, prefix: str) -> bool:
    return not prefix or name == prefix or name.startswith(prefix + ".")


def is_refops_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` contains a refops op and every parameter belongs to one.

    A torch.nn child of a mixed composite cannot materialize by itself, and PyTorch does not promise that it does.
    """
    from ...ops.op import FusibleOperation

    return _owned_by(module, lambda m: isinstance(m, FusibleOperation))


def is_te_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` contains a TransformerEngine module and every parameter belongs to one (by the class's
    Python package, so TransformerEngine need not be importable to tell)."""
    return _owned_by(module, lambda m: type(m).__module__.split(".")[0] == "transformer_engine")


def follows_te_contract(module: torch.nn.Module) -> bool:
    """Whether ``module`` is held to TE's materialization contract by what it is: a refops or a TE module, whose
    ``reset_parameters()`` materializes a meta-built module (TE: on the default CUDA device; refops: on the device
    remembered at construction)."""
    return is_refops_module(module) or is_te_module(module)


def _owned_by(module: torch.nn.Module, library: Callable[[torch.nn.Module], bool]) -> bool:
    """Whether ``module`` contains a module of ``library`` and every parameter owner is one or lies inside one."""
    owners = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    owned = [m for m in owners if any(library(a) for a in _ancestry(module, m))]
    return any(library(m) for m in module.modules()) and len(owned) == len(owners)


def _ancestry(root: torch.nn.Module, target: torch.nn.Module) -> list[torch.nn.Module]:
    """``target`` and the modules between it and ``root`` (inclusive), or [] when it is not inside ``root``."""
    if root is target:
        return [root]
    for child in root.children():
        path = _ancestry(child, target)
        if path:
            return [root, *path]
    return []


def named_reset_roots(module: torch.nn.Module, prefix: str = "") -> list[tuple[str, torch.nn.Module]]:
    """The modules whose ``reset_parameters()`` initializes ``module``, with their names: itself when it defines
    one, else, in registration order (the order eager construction draws random numbers in), the first module
    down each branch that does. A composite module without its own ``reset_parameters()`` is reset through its
    children, as FSDP2 and torchtitan initialize a meta-built model."""
    if callable(getattr(module, "reset_parameters", None)):
        return [(prefix, module)]
    return [root for name, child in module.named_children()
            for root in named_reset_roots(child, f"{prefix}.{name}" if prefix else name)]


def reset_roots(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules of :func:`named_reset_roots`, without their names."""
    return [root for _, root in named_reset_roots(module)]


def _shared_across(roots: list[torch.nn.Module]) -> bool:
    """Whether two of ``roots`` hold the same parameter object."""
    seen: set[int] = set()
    for root in roots:
        ids = {id(p) for p in root.parameters()}
        if ids & seen:
            return True
        seen |= ids
    return False


def over_paths(paths: list[str], check_path: Callable[[str], str]) -> str:
    """Check one property along several materialization paths and combine the outcomes.

    ``check_path(path)`` returns the evidence when the property holds on that path,
    or raises :class:`Violation`, :class:`NotApplicable` or :class:`NotChecked`.
    Any violation makes the property violated; otherwise it holds when it held on
    at least one path, and the evidence says which paths did not apply.
    """
    held, violated, skipped, unchecked = [], [], [], []
    for path in paths:
        try:
            held.append(f"{path}: {check_path(path)}")
        except Violation as error:
            violated.append(f"{path}: {error}")
        except NotApplicable as error:
            skipped.append((path, str(error)))
        except NotChecked as error:
            unchecked.append((path, str(error)))
    if violated:
        raise Violation("; ".join(violated))
    if held:
        notes = [f"not applicable on {', '.join(p for p, _ in skipped)}"] if skipped else []
        notes += [f"{p} not checked ({why})" for p, why in unchecked]
        return "; ".join(held) + (f" [{'; '.join(notes)}]" if notes else "")
    if unchecked:
        raise NotChecked("; ".join(f"{p}: {why}" for p, why in unchecked))
    reasons = {why for _, why in skipped}
    if len(reasons) == 1:
        raise NotApplicable(reasons.pop())
    raise NotApplicable("; ".join(f"{p}: {why}" for p, why in skipped))
