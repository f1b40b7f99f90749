"""Lifecycle properties of a module conversion: what ``convert(module)`` must keep of the module it converts.

A conversion swaps modules or re-wraps parameters after construction (torchao's
``convert_to_float8_training`` swapping ``nn.Linear`` for ``Float8Linear``, a swap
to TE's or refops' ops). The caller gives it as ``check_lifecycle(..., convert=f)``;
it is applied to the eagerly built module, after one parameter owner has been frozen
(``requires_grad=False``), as a user freezes before converting. Parameters are
followed by name: a conversion keeps the names, so that checkpoints still load.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from .evidence import alias_changes, alias_structure, describe_aliases, describe_exception, output_tensors, plural
from .evidence import weighted_sum
from .materialization import parameters_to_freeze
from .probe import NotApplicable, NotChecked, Subject, Violation

__all__ = [
    "ConversionMisuse",
    "requires_grad_kept_through_conversion",
    "aliases_kept_through_conversion",
    "identity_through_conversion",
]


class ConversionMisuse(TypeError):
    """``convert`` returned something other than a module (or None, for a conversion in place)."""


@dataclasses.dataclass
class _Converted:
    """A module before and after the conversion."""

    #: The parameters before, by name (every name, aliases included).
    before: dict[str, torch.nn.Parameter]
    #: The alias structure before.
    aliases: list[tuple[str, ...]]
    #: The names frozen before the conversion.
    frozen: list[str]
    #: What the conversion returned (the module itself, for one in place).
    module: torch.nn.Module


def _convert(s: Subject) -> _Converted:
    if s.convert is None:
        raise NotChecked("needs convert=... (a module conversion, convert(module) -> module) to check")
    module = s.eager()
    frozen = parameters_to_freeze(module)
    if not frozen:
        raise NotApplicable("the module has no parameters")
    before = dict(module.named_parameters(remove_duplicate=False))
    for name in frozen:
        before[name].requires_grad_(False)
    aliases = alias_structure(module)
    try:
        converted = s.convert(module)
    except Exception as error:  # noqa: BLE001  (any failure is evidence)
        raise Violation(f"convert(module) raised {describe_exception(error)}") from error
    if converted is None:
        converted = module
    if not isinstance(converted, torch.nn.Module):
        raise ConversionMisuse(f"check_lifecycle: convert(module) must return the converted torch.nn.Module (or None "
                               f"after converting in place), got {type(converted).__name__}")
    return _Converted(before, aliases, frozen, converted)


def _find(converted: torch.nn.Module, name: str, old: torch.nn.Parameter) -> Optional[torch.nn.Parameter]:
    """The converted module's parameter named ``name``, else the same object under another name, else None."""
    params = dict(converted.named_parameters(remove_duplicate=False))
    if name in params:
        return params[name]
    return next((p for p in params.values() if p is old), None)


def requires_grad_kept_through_conversion(s: Subject) -> str:
    """A parameter frozen before the conversion is frozen after it and gets no grad; every trainable parameter
    of the converted module gets a grad, and none lands on a parameter the conversion left behind."""
    c = _convert(s)
    problems = []
    missing = [n for n in c.frozen if _find(c.module, n, c.before[n]) is None]
    if missing:
        problems.append(f"the converted module has no parameter {', '.join(missing)} (frozen before)")
    flipped = [n for n in c.frozen if n not in missing and _find(c.module, n, c.before[n]).requires_grad]
    if flipped:
        problems.append(f"requires_grad became True on {', '.join(flipped)} (frozen before the conversion)")
    ran = ""
    if s.inputs is not None:
        try:
            loss = weighted_sum(output_tensors(c.module(*s.fresh_inputs(input_requires_grad=True))))
            if loss is not None:
                loss.backward()
        except Exception as error:  # noqa: BLE001  (any failure is evidence)
            raise Violation("; ".join(problems + [f"forward/backward of the converted module raised "
                                                  f"{describe_exception(error)}"])) from error
        current = dict(c.module.named_parameters())
        live = {id(p) for p in current.values()}
        got = [n for n in c.frozen if n not in missing and _find(c.module, n, c.before[n]).grad is not None]
        if got:
            problems.append(f"frozen {', '.join(got)} received a grad")
        starved = sorted(n for n, p in current.items() if p.requires_grad and p.grad is None)
        if starved:
            problems.append(f"trainable {', '.join(starved)} of the converted module received no grad")
        leaked = sorted(n for n, p in c.before.items() if id(p) not in live and p.grad is not None)
        if leaked:
            problems.append(f"the pre-conversion {', '.join(leaked)}, no longer parameters, received grads")
        trained = sum(p.requires_grad for p in current.values())
        ran = f"; backward put grads on the converted module's {plural(trained, 'trainable parameter')}"
    if problems:
        raise Violation("; ".join(problems))
    return f"{', '.join(c.frozen)} stayed frozen through the conversion{' and received no grad' if ran else ''}{ran}"


def aliases_kept_through_conversion(s: Subject) -> str:
    """Names that share a tensor before the conversion share one after it, and no new sharing appears."""
    c = _convert(s)
    # Names the conversion added are left out: a module swapped for one with aliases of its own (refops' and
    # TE's Linear name each parameter twice, weight = basic_ops.0.weight) shares nothing the user tied.
    after = [tuple(n for n in group if n in c.before) for group in alias_structure(c.module)]
    changes = alias_changes(c.aliases, [group for group in after if group])
    if changes:
        raise Violation("; ".join(changes))
    return f"kept through the conversion ({describe_aliases(c.aliases)})"


def identity_through_conversion(s: Subject) -> str:
    """The conversion keeps every parameter object, so an optimizer built before it holds the live ones.

    A refops extension: torchao's ``Float8Linear.from_float`` keeps the objects, but nothing in PyTorch
    or TE promises that a conversion does (build the optimizer after converting).
    """
    c = _convert(s)
    after = dict(c.module.named_parameters(remove_duplicate=False))
    replaced = sorted(n for n, p in c.before.items() if after.get(n) is not p)
    if replaced:
        shown = [f"{n} (id {id(c.before[n]):#x} -> {id(after[n]):#x})" if n in after else f"{n} (gone)"
                 for n in replaced]
        raise Violation(f"the conversion replaced {', '.join(shown)}")
    return f"{plural(len({id(p) for p in c.before.values()}), 'parameter id')} unchanged through the conversion"
