"""Lifecycle conformance: does a module keep the deferred-initialization contract?

:func:`check_lifecycle` takes any module factory ``f(device) -> torch.nn.Module``
(refops ops, TE's ops and plain ``torch.nn`` modules alike), exercises the lifecycle of
``docs/lifecycle.md`` on it, and reports every property with the evidence. Example::

    report = check_lifecycle(
        lambda device: refops.ops.Linear(16, 8, device=device),
        inputs=lambda device: (torch.randn(4, 16, device=device),),
    )
    print(report)
    report.assert_ok()

The properties, in report order, are listed in :data:`PROPERTIES`, each a *promise*
(what PyTorch or TransformerEngine promise: held or violated) or a refops *extension*
(kept or not kept; it fails the report only under ``strict=True``).
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Any, Callable, Optional

import torch

from . import checkpoint, conversion, materialization, replacement
from .evidence import describe_exception
from .probe import NotApplicable, NotChecked, Subject, Violation
from .report import Kind, LifecycleReport, PropertyResult, Status

__all__ = ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status", "Kind", "Property", "PROPERTIES"]

Check = Callable[[Subject], str]


@dataclasses.dataclass(frozen=True)
class Property:
    """One property: its check (whose docstring states it) and whose promise it is."""

    check: Check
    kind: Kind = Kind.PROMISE
    #: For an extension a module may claim as its own: the ``check_lifecycle`` keyword that claims it, which
    #: makes the property a promise of that module.
    claimed_by: Optional[str] = None


#: Every property, in report order, with its kind. Each check's docstring states the property.
PROPERTIES: dict[str, Property] = {
    "zero_allocation_on_meta": Property(materialization.zero_allocation_on_meta),
    "materializable_from_meta": Property(materialization.materializable_from_meta),
    "eager_values_after_reset_parameters": Property(materialization.eager_values_after_reset_parameters),
    "eager_values_after_to_empty": Property(materialization.eager_values_after_to_empty),
    "eager_values_after_first_forward": Property(materialization.eager_values_after_first_forward, Kind.EXTENSION,
                                                 claimed_by="materializes_at_first_forward"),
    "identity_through_materialization": Property(materialization.identity_through_materialization, Kind.EXTENSION),
    "aliases_preserved": Property(materialization.aliases_preserved),
    "requires_grad_kept": Property(materialization.requires_grad_kept),
    "no_stale_cache_after_replacement": Property(replacement.no_stale_cache_after_replacement),
    "load_state_dict_assign_into_meta": Property(replacement.load_state_dict_assign_into_meta),
    "deepcopy_keeps_aliases_and_shares_nothing": Property(replacement.deepcopy_keeps_aliases_and_shares_nothing),
    "checkpoint_round_trip": Property(checkpoint.checkpoint_round_trip),
    "checkpoint_round_trip_after_training": Property(checkpoint.checkpoint_round_trip_after_training),
    "requires_grad_kept_through_conversion": Property(conversion.requires_grad_kept_through_conversion),
    "aliases_kept_through_conversion": Property(conversion.aliases_kept_through_conversion),
    "identity_through_conversion": Property(conversion.identity_through_conversion, Kind.EXTENSION),
}


def check_lifecycle(
    factory: Callable[[torch.device], torch.nn.Module],
    *,
    device: Optional[torch.device | str] = None,
    inputs: Optional[Callable[[torch.device], tuple[Any, ...]]] = None,
    seed: int = 0,
    materializes_through_reset_parameters: Optional[bool] = None,
    materializes_at_first_forward: bool = False,
    convert: Optional[Callable[[torch.nn.Module], Optional[torch.nn.Module]]] = None,
    strict: bool = False,
    lazy: Optional[bool] = None,
) -> LifecycleReport:
    """Check every lifecycle property of the modules ``factory`` builds.

    The factory is called many times: on ``meta`` and on ``device``, each time
    right after ``torch.manual_seed`` so that the values of a meta-built,
    materialized module can be compared bit for bit with eager construction.
    The caller's RNG state and default device are restored afterwards.

    Args:
        factory: builds the module on the device it is given (``meta`` included). It may wrap the
            module's forward in a recipe (``te.autocast``): every forward and training step runs as
            the module is called.
        device: the real device to materialize on (default: torch's default device).
        inputs: ``inputs(device)`` returns the forward arguments, for example
            ``(x, split_sizes)``. Drawn once and cloned for every run. Without it,
            the properties that need a forward and backward are "not checked".
        seed: the seed used before every construction and materialization.
        materializes_through_reset_parameters: whether ``reset_parameters()`` on the meta-built
            module must materialize it (TE's contract: no tensor left on meta, the eager values).
            ``None`` (default): claimed by each module reset that is a refops or TE module, or that
            moves at least one tensor off meta, so a partial materialization is a violation, while a
            module whose reset leaves every tensor on meta (``torch.nn.Linear``, under PyTorch's
            ``to_empty()`` convention) makes no claim. ``True``: claimed by all. ``False``: the module
            follows PyTorch's convention; the path is observed, never required.
        materializes_at_first_forward: whether the module claims to materialize at its first forward
            (TE's ops do, in ``pre_first_fuser_forward``). Default False: that is a refops extension,
            reported kept or not kept; True makes it a promise of the module.
        convert: a module conversion, ``convert(module) -> module`` (or None after converting in
            place), applied to the eagerly built module after one parameter owner is frozen. Without
            it, the conversion properties are "not checked".
        strict: whether a refops extension that is not kept fails the report (default False: it is
            reported "not kept (refops extension)" and ``report.ok`` stays True).
        lazy: deprecated. ``True`` is ``materializes_through_reset_parameters=True,
            materializes_at_first_forward=True``; ``False`` is both False; ``None`` the defaults.

    Returns:
        A :class:`LifecycleReport` with one result per property of :data:`PROPERTIES`.

    Raises:
        TypeError: ``factory`` is a module rather than a function that builds one, cannot be called
            as ``factory(device)``, returns something other than a module, or builds its parameters
            off meta when given ``meta`` (it does not pass its device on); ``inputs`` is not a
            callable or does not return a tuple; ``convert`` is not a callable of one module, or
            returns something other than a module; a claim, ``strict`` or ``lazy`` is not a bool
            (or None where allowed); ``lazy`` is given together with a claim.
        ValueError: ``device`` is ``meta``, not a device, or CUDA where there is none.
    """
    device = _target_device(device)
    _check_callable("factory", factory, "factory(device) -> torch.nn.Module",
                    "factory=lambda device: MyModule(..., device=device)", torch.device("meta"))
    if inputs is not None:
        _check_callable("inputs", inputs, "inputs(device) -> tuple of forward arguments",
                        "inputs=lambda device: (torch.randn(4, 16, device=device),)", torch.device("meta"))
    if convert is not None:
        _check_callable("convert", convert, "convert(module) -> the converted module (or None, in place)",
                        "convert=lambda module: swap_linears(module)", torch.nn.Identity(), what="the module")
    _check_flag("materializes_through_reset_parameters", materializes_through_reset_parameters, optional=True)
    _check_flag("materializes_at_first_forward", materializes_at_first_forward)
    _check_flag("strict", strict)
    _check_flag("lazy", lazy, optional=True)
    if lazy is not None:
        if materializes_through_reset_parameters is not None or materializes_at_first_forward:
            raise TypeError("check_lifecycle: lazy is the deprecated spelling of materializes_through_reset_parameters "
                            "and materializes_at_first_forward; give those, not both spellings")
        warnings.warn("check_lifecycle: lazy= is deprecated; pass materializes_through_reset_parameters= and "
                      "materializes_at_first_forward= (lazy=True is both True)", DeprecationWarning, stacklevel=2)
        materializes_through_reset_parameters, materializes_at_first_forward = lazy, lazy
    claims = {"materializes_at_first_forward": materializes_at_first_forward}
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), torch.device(device), torch.enable_grad():
        name = _check_factory_builds_on_meta(factory)
        torch.manual_seed(seed)
        args = None if inputs is None else _forward_arguments(inputs, device)
        subject = Subject(factory, device, args, seed, materializes_through_reset_parameters,
                          materializes_at_first_forward, convert)
        results = tuple(_check(name, prop, subject, claims) for name, prop in PROPERTIES.items())
        return LifecycleReport(name, str(device), results, strict)


def _check_flag(argument: str, value: Any, *, optional: bool = False) -> None:
    if isinstance(value, bool) or (optional and value is None):
        return
    allowed = "True, False or None" if optional else "True or False"
    raise TypeError(f"check_lifecycle: {argument} must be {allowed}, got {type(value).__name__} {value!r}")


def _target_device(device: Optional[torch.device | str]) -> torch.device:
    """The real device to materialize on; index-less ``cuda`` is the current CUDA device."""
    try:
        device = torch.device(device) if device is not None else torch.get_default_device()
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"check_lifecycle: device must be a torch device or its name, got {device!r} ({error})")
    if device.type == "meta":
        raise ValueError("check_lifecycle: device must be a real device (the checks build on meta themselves)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"check_lifecycle: device {device} was asked for, but torch reports no CUDA device")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return device


#: Why a module is not what an argument wants, by argument.
_NOT_A_MODULE = {
    "convert": "it is called on the module the check builds",
}
_BUILDS_MANY_TIMES = "the check builds the module many times, on meta and on the device, so it needs to know how"


def _check_callable(argument: str, value: Any, protocol: str, example: str, probe: Any,
                    what: str = "the device") -> None:
    """``value`` is a callable that takes ``what`` (for which ``probe`` stands) as its one positional argument."""
    if isinstance(value, torch.nn.Module):
        raise TypeError(
            f"check_lifecycle: {argument} must be a function, {protocol}, not a module: "
            f"{_NOT_A_MODULE.get(argument, _BUILDS_MANY_TIMES)} (write {example})"
        )
    if not callable(value):
        raise TypeError(f"check_lifecycle: {argument} must be a callable, {protocol}; got {type(value).__name__} "
                        f"(write {example})")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return  # a builtin or an extension type: its call will tell
    try:
        signature.bind(probe)
    except TypeError as error:
        name = getattr(value, "__qualname__", type(value).__name__)
        raise TypeError(
            f"check_lifecycle: {argument} must take {what} as its one positional argument, {protocol}; "
            f"{name}{signature} cannot be called that way ({error}) (write {example})"
        ) from None


def _forward_arguments(inputs: Callable[[torch.device], Any], device: torch.device) -> tuple[Any, ...]:
    args = inputs(device)
    if not isinstance(args, (tuple, list)):
        raise TypeError(
            f"check_lifecycle: inputs(device) must return a tuple of forward arguments, got {type(args).__name__} "
            "(a single input is a tuple of one: lambda device: (x,))"
        )
    return tuple(args)


def _check_factory_builds_on_meta(factory: Callable[[torch.device], Any]) -> str:
    """Build once on meta: what the report calls the subject. A factory that returns no module, or
    whose module's parameters are all real when it is given ``meta``, is misused, not a module that
    breaks every property. A factory that raises is left to the properties (that is evidence)."""
    try:
        module = factory(torch.device("meta"))
    except Exception:  # noqa: BLE001  (the properties report the failure itself)
        return getattr(factory, "__qualname__", repr(factory))
    if not isinstance(module, torch.nn.Module):
        raise TypeError(f"check_lifecycle: factory(device) must return a torch.nn.Module, got {type(module).__name__}")
    params = dict(module.named_parameters())
    tensors = {**params, **dict(module.named_buffers())}
    if params and not any(t.is_meta for t in tensors.values()):
        where = sorted({str(t.device) for t in tensors.values()})
        raise TypeError(
            f"check_lifecycle: factory(torch.device('meta')) built {type(module).__name__} with every parameter and "
            f"buffer on {', '.join(where)}: the factory must build on the device it is given "
            f"(lambda device: {type(module).__name__}(..., device=device)); a module that ignores device='meta' "
            "cannot be built deferred, which is what this check is about"
        )
    return type(module).__name__


def _check(name: str, prop: Property, subject: Subject, claims: dict[str, bool]) -> PropertyResult:
    """Run one property's check; an extension the module claims (``claims[prop.claimed_by]``) is a promise."""
    description = (prop.check.__doc__ or "").strip().splitlines()[0]
    kind = Kind.PROMISE if prop.claimed_by and claims.get(prop.claimed_by) else prop.kind
    held, violated = (Status.HELD, Status.VIOLATED) if kind is Kind.PROMISE else (Status.KEPT, Status.NOT_KEPT)
    try:
        return PropertyResult(name, held, prop.check(subject), description, kind)
    except conversion.ConversionMisuse:
        raise  # the caller's convert is misused: an error, not evidence
    except Violation as error:
        return PropertyResult(name, violated, str(error), description, kind)
    except NotApplicable as error:
        return PropertyResult(name, Status.NOT_APPLICABLE, str(error), description, kind)
    except NotChecked as error:
        return PropertyResult(name, Status.NOT_CHECKED, str(error), description, kind)
    except Exception as error:  # noqa: BLE001  (the module failed somewhere the check did not expect)
        return PropertyResult(name, violated, f"raised {describe_exception(error)}", description, kind)
