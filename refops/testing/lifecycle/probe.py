"""What the lifecycle checks share: the module under test, its materialization paths, their outcomes.

A :class:`Subject` holds the factory ``f(device) -> torch.nn.Module``, the
target device, the forward inputs and the seed. A module built on ``meta`` can
be materialized along three paths:

* ``reset_parameters``: ``module.reset_parameters()`` alone (refops' explicit entry point);
* ``to_empty``: ``module.to_empty(device=d)`` then ``module.reset_parameters()``
  (PyTorch's convention, which every module is expected to follow);
* ``first_forward``: calling the module on real inputs (refops' lazy path, like
  ``pre_first_fuser_forward`` in TransformerEngine).

Modules that contain a refops op are expected to support all three. Other
modules are expected to support ``to_empty`` only; when the other two raise or
leave every parameter on ``meta``, the path is reported as not applicable
rather than violated, because that is PyTorch's documented behaviour.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from .evidence import describe_exception, named_tensors, output_tensors, weighted_sum

__all__ = ["Subject", "Violation", "NotApplicable", "NotChecked", "PATHS", "over_paths", "reset_roots",
           "is_refops_module"]

#: The materialization paths, and how the evidence names them.
PATHS: dict[str, str] = {
    "reset_parameters": "reset_parameters() on the meta-built module (or on each child, for a composite)",
    "to_empty": "to_empty() + reset_parameters() on the meta-built module",
    "first_forward": "the first forward of the meta-built module",
}


class Violation(Exception):
    """The property does not hold; the message is the evidence."""


class NotApplicable(Exception):
    """The property (or one path of it) does not apply; the message says why."""


class NotChecked(Exception):
    """The property needs something that was not given (forward inputs); the message says what."""


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
    #: Whether the module is expected to materialize by itself (``reset_parameters``
    #: and ``first_forward``); ``None`` means "when it contains a refops op".
    lazy: Optional[bool] = None

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

    def expects_lazy(self, module: torch.nn.Module) -> bool:
        """Whether failing to materialize through ``reset_parameters`` or the first forward is a violation."""
        if self.lazy is not None:
            return self.lazy
        return is_refops_module(module)

    # ---------------------------------------------------------------- running
    def fresh_inputs(self, *, input_requires_grad: bool = False) -> tuple[Any, ...]:
        """Clones of the inputs; optionally the first floating-point one requires grad."""
        if self.inputs is None:
            raise NotChecked("needs inputs=... to run forward and backward")
        args, marked = [], False
        for arg in self.inputs:
            if isinstance(arg, torch.Tensor):
                arg = arg.detach().clone()
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
            Violation: the path is expected to work and it raised or left tensors on meta.
            NotApplicable: the module does not use this path (see the module docstring).
        """
        name = type(module).__name__
        roots = reset_roots(module)
        if path != "first_forward" and not roots:
            raise NotApplicable(f"neither {name} nor any of its submodules defines reset_parameters()")
        if path != "first_forward" and _shared_across(roots):
            raise NotApplicable(
                f"{name} defines no reset_parameters() and its children share parameters (tied weights): "
                "resetting each child would initialize a shared parameter twice; define reset_parameters() "
                f"on {name} to reset and re-tie"
            )
        expected = path == "to_empty" or self.expects_lazy(module)
        torch.manual_seed(self.seed)
        outputs: list[torch.Tensor] = []
        try:
            if path == "to_empty":
                module.to_empty(device=self.device)
            if path == "first_forward":
                outputs = output_tensors(module(*args))
            else:
                for root in roots:
                    root.reset_parameters()
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            if expected:
                raise Violation(f"{PATHS[path]} raised {describe_exception(error)}") from error
            raise NotApplicable(
                f"{name} does not materialize through {PATHS[path]} (it raised {describe_exception(error)}); "
                "PyTorch modules materialize through to_empty()"
            ) from error
        left = sorted(n for n, t in named_tensors(module).items() if t.is_meta)
        if left and not expected:
            which = "every tensor" if len(left) == len(named_tensors(module)) else ", ".join(left)
            raise NotApplicable(
                f"{PATHS[path]} leaves {which} of {name} on meta (PyTorch's convention: "
                "materialize with to_empty() first)"
            )
        if left:
            raise Violation(f"{PATHS[path]} left {', '.join(left)} on meta")
        return outputs


def is_refops_module(module: torch.nn.Module) -> bool:
    """Whether ``module`` contains a refops op and every parameter belongs to one (whatever ``lazy`` says).

    A torch.nn child of a mixed composite cannot materialize by itself, and PyTorch does not promise that it does.
    """
    from ...ops.op import FusibleOperation

    owners = [m for m in module.modules() if any(True for _ in m.parameters(recurse=False))]
    refops_owned = [m for m in owners if any(isinstance(a, FusibleOperation) for a in _ancestry(module, m))]
    contains = any(isinstance(m, FusibleOperation) for m in module.modules())
    return contains and len(refops_owned) == len(owners)


def _ancestry(root: torch.nn.Module, target: torch.nn.Module) -> list[torch.nn.Module]:
    """``target`` and the modules between it and ``root`` (inclusive), or [] when it is not inside ``root``."""
    if root is target:
        return [root]
    for child in root.children():
        path = _ancestry(child, target)
        if path:
            return [root, *path]
    return []


def reset_roots(module: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose ``reset_parameters()`` initializes ``module``: itself when it defines one, else,
    in registration order (the order eager construction draws random numbers in), the first module down
    each branch that does. A composite module without its own ``reset_parameters()`` is reset through its
    children, as FSDP2 and torchtitan initialize a meta-built model."""
    if callable(getattr(module, "reset_parameters", None)):
        return [module]
    return [root for child in module.children() for root in reset_roots(child)]


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
