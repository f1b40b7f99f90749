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
        ValueError: ``device`` is ``meta``.
    """
    device = torch.device(device) if device is not None else torch.get_default_device()
    if device.type == "meta":
        raise ValueError("check_lifecycle: device must be a real device (the checks build on meta themselves)")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    rng_devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=rng_devices), torch.device(device), torch.enable_grad():
        torch.manual_seed(seed)
        args = None if inputs is None else tuple(inputs(device))
        subject = Subject(factory, device, args, seed, lazy)
        results = tuple(_check(name, check, subject) for name, check in PROPERTIES.items())
        return LifecycleReport(_subject_name(factory), str(device), results)


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


def _subject_name(factory: Callable[[torch.device], torch.nn.Module]) -> str:
    """The class name of what the factory builds (on meta, so nothing is allocated)."""
    try:
        return type(factory(torch.device("meta"))).__name__
    except Exception:  # noqa: BLE001  (the properties report the failure itself)
        return getattr(factory, "__qualname__", repr(factory))
