"""Lifecycle conformance: does a module keep the deferred-initialization contract?

:func:`check_lifecycle` takes any module factory ``f(device) -> torch.nn.Module``
(refops ops and plain ``torch.nn`` modules alike), exercises the lifecycle of
``docs/lifecycle.md`` on it, and reports every property as held, violated, not
checked or not applicable, with the evidence. Example::

    report = check_lifecycle(
        lambda device: refops.ops.Linear(16, 8, device=device),
        inputs=lambda device: (torch.randn(4, 16, device=device),),
    )
    print(report)
    report.assert_ok()

The properties, in report order, are listed in :data:`PROPERTIES`. Three of them
describe refops' extensions of PyTorch's conventions (materializing through
``reset_parameters()`` alone or at the first forward, in place): for a module
that contains no refops op they apply only when the module turns out to
materialize that way, and are reported as not applicable, with the reason,
when it follows PyTorch's ``to_empty()`` convention instead.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

import torch

from . import materialization
from . import replacement
from .evidence import describe_exception
from .probe import NotApplicable, NotChecked, Subject, Violation
from .report import LifecycleReport, PropertyResult, Status

__all__ = ["check_lifecycle", "LifecycleReport", "PropertyResult", "Status", "PROPERTIES"]

Check = Callable[[Subject], str]

#: Every property, in report order: ``{name: check}``. Each check's docstring states the property.
PROPERTIES: dict[str, Check] = {
    "zero_allocation_on_meta": materialization.zero_allocation_on_meta,
    "eager_values_after_reset_parameters": materialization.eager_values_after_reset_parameters,
    "eager_values_after_to_empty": materialization.eager_values_after_to_empty,
    "eager_values_after_first_forward": materialization.eager_values_after_first_forward,
    "identity_through_materialization": materialization.identity_through_materialization,
    "aliases_preserved": materialization.aliases_preserved,
    "requires_grad_kept": materialization.requires_grad_kept,
    "no_stale_cache_after_replacement": replacement.no_stale_cache_after_replacement,
    "load_state_dict_assign_into_meta": replacement.load_state_dict_assign_into_meta,
    "deepcopy_keeps_aliases_and_shares_nothing": replacement.deepcopy_keeps_aliases_and_shares_nothing,
    "checkpoint_round_trip": replacement.checkpoint_round_trip,
}


def check_lifecycle(
    factory: Callable[[torch.device], torch.nn.Module],
    *,
    device: Optional[torch.device | str] = None,
    inputs: Optional[Callable[[torch.device], tuple[Any, ...]]] = None,
    seed: int = 0,
    lazy: Optional[bool] = None,
) -> LifecycleReport:
    """Check every lifecycle property of the modules ``factory`` builds.

    The factory is called many times: on ``meta`` and on ``device``, each time
    right after ``torch.manual_seed`` so that the values of a meta-built,
    materialized module can be compared bit for bit with eager construction.
    The caller's RNG state and default device are restored afterwards.

    Args:
        factory: builds the module on the device it is given (``meta`` included).
        device: the real device to materialize on (default: torch's default device).
        inputs: ``inputs(device)`` returns the forward arguments, for example
            ``(x, split_sizes)``. Drawn once and cloned for every run. Without it,
            the properties that need a forward and backward are "not checked".
        seed: the seed used before every construction and materialization.
        lazy: whether the module materializes meta parameters itself (through
            ``reset_parameters()`` alone and at the first forward), so that failing
            to is a violation. ``None``: expected of modules that contain a refops
            op, and for others observed rather than required.

    Returns:
        A :class:`LifecycleReport` with one result per property of :data:`PROPERTIES`.

    Raises:
        TypeError: ``factory`` is a module rather than a function that builds one, cannot be called
            as ``factory(device)``, returns something other than a module, or builds its parameters
            off meta when given ``meta`` (it does not pass its device on); ``inputs`` is not a
            callable or does not return a tuple; ``lazy`` is not a bool or None.
        ValueError: ``device`` is ``meta``, not a device, or CUDA where there is none.
    """
    device = _target_device(device)
    _check_callable("factory", factory, "factory(device) -> torch.nn.Module",
                    "factory=lambda device: MyModule(..., device=device)")
    if inputs is not None:
        _check_callable("inputs", inputs, "inputs(device) -> tuple of forward arguments",
                        "inputs=lambda device: (torch.randn(4, 16, device=device),)")
    if lazy is not None and not isinstance(lazy, bool):
        raise TypeError(f"check_lifecycle: lazy must be True, False or None, got {type(lazy).__name__} {lazy!r}")
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), torch.device(device), torch.enable_grad():
        name = _check_factory_builds_on_meta(factory)
        torch.manual_seed(seed)
        args = None if inputs is None else _forward_arguments(inputs, device)
        subject = Subject(factory, device, args, seed, lazy)
        results = tuple(_check(name, check, subject) for name, check in PROPERTIES.items())
        return LifecycleReport(name, str(device), results)


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


def _check_callable(argument: str, value: Any, protocol: str, example: str) -> None:
    """``value`` is a callable that takes the device as its one positional argument."""
    if isinstance(value, torch.nn.Module):
        raise TypeError(
            f"check_lifecycle: {argument} must be a function, {protocol}, not a module: the check builds the module "
            f"many times, on meta and on the device, so it needs to know how (write {example})"
        )
    if not callable(value):
        raise TypeError(f"check_lifecycle: {argument} must be a callable, {protocol}; got {type(value).__name__} "
                        f"(write {example})")
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):
        return  # a builtin or an extension type: its call will tell
    try:
        signature.bind(torch.device("meta"))
    except TypeError as error:
        name = getattr(value, "__qualname__", type(value).__name__)
        raise TypeError(
            f"check_lifecycle: {argument} must take the device as its one positional argument, {protocol}; "
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


def _check(name: str, check: Check, subject: Subject) -> PropertyResult:
    description = (check.__doc__ or "").strip().splitlines()[0]
    try:
        return PropertyResult(name, Status.HELD, check(subject), description)
    except Violation as error:
        return PropertyResult(name, Status.VIOLATED, str(error), description)
    except NotApplicable as error:
        return PropertyResult(name, Status.NOT_APPLICABLE, str(error), description)
    except NotChecked as error:
        return PropertyResult(name, Status.NOT_CHECKED, str(error), description)
    except Exception as error:  # noqa: BLE001  (the module failed somewhere the check did not expect)
        return PropertyResult(name, Status.VIOLATED, f"raised {describe_exception(error)}", description)

