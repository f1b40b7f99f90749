"""Quantization state: ``autocast``, ``quantized_model_init`` and when delayed scaling updates.

``autocast(enabled=True, recipe=R)`` turns on quantized compute with recipe
``R``. ``quantized_model_init(enabled=True, recipe=R)`` makes ops constructed
inside it store their weights quantized. Delayed-scaling amax histories and
scales update at exactly two points (``docs/recipes/delayed-scaling.md#the-arithmetic``):

* forward tensors: when the *outermost* ``autocast`` exits with grad enabled;
* backward tensors: when the backward of the first fuser that ran forward inside
  that ``autocast`` ends (the last backward to run).

Nothing updates under ``torch.no_grad``: amaxes keep accumulating and scales freeze.

The state is each thread's own, and contexts left in any order leave nothing behind
(``refops.quantization.thread_state``; ``docs/api/refops.md#threads-and-nesting``).
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from .. import trace
from .thread_state import LOCK, AutocastFrame, InitFrame, current, push, remove

__all__ = [
    "autocast",
    "fp8_autocast",
    "quantized_model_init",
    "fp8_model_init",
    "get_default_recipe",
    "is_quantization_enabled",
    "get_autocast_recipe",
    "with_quantized_parameters",
    "get_quantized_parameters_recipe",
    "preserve_high_precision_init_val",
    "register_delayed_state",
    "claim_first_module",
]


def get_default_recipe() -> Any:
    """TE's default for this machine: MXFP8 on sm_100..sm_11x, current scaling on sm_12x, else delayed scaling.

    On CPU (every recipe runs there in refops) the default is delayed scaling, TE's
    default on Hopper.
    """
    from ..recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling

    if torch.cuda.is_available():
        major, _ = torch.cuda.get_device_capability()
        if 10 <= major < 12:
            return MXFP8BlockScaling()
        if major >= 12:
            return Float8CurrentScaling()
    return DelayedScaling()


def is_quantization_enabled() -> bool:
    """True inside ``autocast(enabled=True)`` (on this thread: ``docs/api/refops.md#threads-and-nesting``)."""
    return current().enabled


def get_autocast_recipe() -> Any:
    """The active autocast recipe, or None outside ``autocast(enabled=True)``."""
    return current().recipe


def with_quantized_parameters() -> bool:
    """True inside ``quantized_model_init(enabled=True)``."""
    return current().parameters_enabled


def get_quantized_parameters_recipe() -> Any:
    """The recipe of the enclosing ``quantized_model_init``, or None."""
    return current().parameters_recipe


def preserve_high_precision_init_val() -> bool:
    """Whether ops built now keep a CPU copy of the high-precision initial weights."""
    s = current()
    return s.parameters_enabled and s.high_precision_init_val


def register_delayed_state(state: Any, mode: str) -> None:
    """A delayed-scaling recipe state in use: its op runs now, so the next ``mode`` update reaches it."""
    s = current()
    (s.forward_states if mode == "forward" else s.backward_states)[state] = None


def claim_first_module() -> bool:
    """True exactly once per outermost autocast: the fuser that gets it runs the backward update."""
    s = current()
    with LOCK:  # a context left on another thread may be changing the flag
        if not s.enabled or s.first_module_claimed:
            return False
        s.first_module_claimed = True
        return True


def _update_delayed_states(mode: str, group: Any, in_use: Optional[dict] = None) -> None:
    """Update the ``mode`` states in use (``in_use``: the backward set of one autocast), in first-use order, and
    empty that set."""
    if in_use is None:
        s = current()
        in_use = s.forward_states if mode == "forward" else s.backward_states
    states = list(in_use)
    in_use.clear()
    for state in states:
        state.update_scales(reduction_group=group)
    if states:
        trace.record("scale_update", f"delayed scaling ({mode})", states=len(states))


def backward_update_callback() -> Callable[[], None]:
    """What the first module's backward runs at its end: the backward update of the states its autocast
    registered (captured now, with the current reduction group), whatever autocasts ran forward since."""
    s = current()
    group, in_use = s.amax_reduction_group, s.backward_states
    return lambda: _update_delayed_states("backward", group, in_use)


class autocast:
    """Enable quantized compute with ``recipe`` (default: :func:`get_default_recipe`).

    Nesting is counted; the forward delayed-scaling update runs at the outermost
    exit when grad is enabled. Re-entering an instance that is already active is
    an error, as in TE. The state is the calling thread's, and contexts may be left
    in any order (``docs/api/refops.md#threads-and-nesting``).
    """

    def __init__(
        self,
        enabled: bool = True,
        calibrating: bool = False,
        recipe: Any = None,
        amax_reduction_group: Any = None,
        _graph: bool = False,
    ) -> None:
        if recipe is None and enabled:
            recipe = get_default_recipe()
        if recipe is not None:
            _check_recipe(recipe)
        self.enabled, self.calibrating, self.recipe = enabled, calibrating, recipe
        self.amax_reduction_group, self._graph = amax_reduction_group, _graph
        self._open: Optional[tuple[Any, AutocastFrame]] = None  # (the entering thread's state, this frame)

    def __enter__(self) -> "autocast":
        frame = AutocastFrame(self.enabled, self.calibrating, self.recipe if self.enabled else None,
                              self.amax_reduction_group, self._graph)
        s = current()
        with LOCK:
            if self._open is not None:
                raise RuntimeError("refops.autocast: this context is already active; use a new instance to nest")
            if not s.autocasts:  # a new outermost span
                s.first_module_claimed = False
                s.backward_states = {}  # this autocast's own backward set (the one before is its backward's)
                s.opener = frame
            frame.claimed_before = s.first_module_claimed
            push(s.autocasts, frame)
            self._open = (s, frame)
        return self

    def __exit__(self, *exc: object) -> None:
        to_update: Optional[dict] = None
        with LOCK:
            if self._open is None:
                raise RuntimeError("refops.autocast: __exit__ of a context that is not active")
            (s, frame), self._open = self._open, None
            above = remove(s.autocasts, frame)
            if above is not None:  # left out of order: the frame above restores what this one would have
                above.claimed_before = frame.claimed_before
            elif s.autocasts:
                s.first_module_claimed = frame.claimed_before
            if not s.autocasts:  # the span's last frame: the one that opened it decides the forward update
                opener, s.opener = s.opener, None
                raised = bool(exc) and exc[0] is not None
                if opener.enabled and not opener.graph and torch.is_grad_enabled() and not raised:
                    to_update, s.forward_states = s.forward_states, {}
        if to_update is not None:  # outside the lock: with amax reduction an update is a collective
            _update_delayed_states("forward", opener.amax_reduction_group, to_update)


def fp8_autocast(
    enabled: bool = True, calibrating: bool = False, fp8_recipe: Any = None, fp8_group: Any = None, _graph: bool = False
) -> autocast:
    """Deprecated TE name for :class:`autocast`."""
    warnings.warn("fp8_autocast is deprecated; use refops.autocast", DeprecationWarning, stacklevel=2)
    return autocast(enabled=enabled, calibrating=calibrating, recipe=fp8_recipe, amax_reduction_group=fp8_group,
                    _graph=_graph)


class quantized_model_init:
    """Ops constructed inside store their weights quantized with ``recipe``.

    The recipe is remembered by each op at construction (beyond TE), so a meta
    weight can be materialized, quantized, at a first forward outside
    ``autocast``. ``preserve_high_precision_init_val`` keeps a CPU copy of each
    weight's high-precision initial values (``weight.get_high_precision_init_val()``).
    """

    def __init__(
        self, enabled: bool = True, recipe: Any = None, preserve_high_precision_init_val: bool = False
    ) -> None:
        if enabled and recipe is None:
            recipe = get_default_recipe()
        if recipe is not None:
            _check_recipe(recipe)
        self.enabled, self.recipe, self.preserve = enabled, recipe, preserve_high_precision_init_val
        self._open: Optional[tuple[Any, InitFrame]] = None  # (the entering thread's state, this frame)

    def __enter__(self) -> "quantized_model_init":
        frame = InitFrame(self.enabled, self.recipe if self.enabled else None, self.preserve)
        s = current()
        with LOCK:
            if self._open is not None:
                raise RuntimeError("refops.quantized_model_init: this context is already active; "
                                   "use a new instance to nest")
            push(s.inits, frame)
            self._open = (s, frame)
        return self

    def __exit__(self, *exc: object) -> None:
        with LOCK:
            if self._open is None:
                raise RuntimeError("refops.quantized_model_init: __exit__ of a context that is not active")
            (s, frame), self._open = self._open, None
            remove(s.inits, frame)


def fp8_model_init(
    enabled: bool = True, recipe: Any = None, preserve_high_precision_init_val: bool = False
) -> quantized_model_init:
    """Deprecated TE name for :class:`quantized_model_init`."""
    warnings.warn("fp8_model_init is deprecated; use refops.quantized_model_init", DeprecationWarning, stacklevel=2)
    return quantized_model_init(enabled, recipe, preserve_high_precision_init_val)


def _check_recipe(recipe: Any) -> None:
    from ..recipe import Recipe

    if not isinstance(recipe, Recipe):
        raise TypeError(f"expected a refops.recipe.Recipe, got {type(recipe).__name__}")
