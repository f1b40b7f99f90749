"""Global quantization state: ``autocast``, ``quantized_model_init`` and when delayed scaling updates.

``autocast(enabled=True, recipe=R)`` turns on quantized compute with recipe
``R``. ``quantized_model_init(enabled=True, recipe=R)`` makes ops constructed
inside it store their weights quantized. Delayed-scaling amax histories and
scales update at exactly two points (``docs/recipes/delayed-scaling.md#the-arithmetic``):

* forward tensors: when the *outermost* ``autocast`` exits with grad enabled;
* backward tensors: when the backward of the first fuser that ran forward inside
  that ``autocast`` ends (the last backward to run).

Nothing updates under ``torch.no_grad``: amaxes keep accumulating and scales freeze.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Optional

import torch

from .. import trace

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


@dataclasses.dataclass
class _GlobalState:
    enabled: bool = False
    calibrating: bool = False
    recipe: Any = None
    amax_reduction_group: Any = None
    depth: int = 0
    first_module_claimed: bool = False
    parameters_enabled: bool = False
    parameters_recipe: Any = None
    high_precision_init_val: bool = False
    # Delayed-scaling states of the ops that ran under autocast, in first-use order: the forward ones since
    # the last forward update; the backward ones of the current outermost autocast (each autocast gets its
    # own set, which its first module's backward updates: interleaved microbatches F1 F2 B1 B2 update at B1
    # and at B2, one history row each). Only these are updated: the set is what the program ran, the same on
    # every rank, whatever the garbage collector has freed (with amax reduction each state's update is a
    # collective, so two ranks must visit the same states in the same order). Held strongly until their
    # update, so no collection can change the set in between.
    forward_states: dict = dataclasses.field(default_factory=dict)
    backward_states: dict = dataclasses.field(default_factory=dict)

_STATE = _GlobalState()


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
    """True inside ``autocast(enabled=True)``."""
    return _STATE.enabled


def get_autocast_recipe() -> Any:
    """The active autocast recipe, or None outside ``autocast(enabled=True)``."""
    return _STATE.recipe if _STATE.enabled else None


def with_quantized_parameters() -> bool:
    """True inside ``quantized_model_init(enabled=True)``."""
    return _STATE.parameters_enabled


def get_quantized_parameters_recipe() -> Any:
    """The recipe of the enclosing ``quantized_model_init``, or None."""
    return _STATE.parameters_recipe if _STATE.parameters_enabled else None


def preserve_high_precision_init_val() -> bool:
    """Whether ops built now keep a CPU copy of the high-precision initial weights."""
    return _STATE.parameters_enabled and _STATE.high_precision_init_val


def register_delayed_state(state: Any, mode: str) -> None:
    """A delayed-scaling recipe state in use: its op runs now, so the next ``mode`` update reaches it."""
    (_STATE.forward_states if mode == "forward" else _STATE.backward_states)[state] = None


def claim_first_module() -> bool:
    """True exactly once per outermost autocast: the fuser that gets it runs the backward update."""
    if not _STATE.enabled or _STATE.first_module_claimed:
        return False
    _STATE.first_module_claimed = True
    return True


def _update_delayed_states(mode: str, group: Any, in_use: Optional[dict] = None) -> None:
    """Update the ``mode`` states in use (``in_use``: the backward set of one autocast), in first-use order, and
    empty that set."""
    if in_use is None:
        in_use = _STATE.forward_states if mode == "forward" else _STATE.backward_states
    states = list(in_use)
    in_use.clear()
    for state in states:
        state.update_scales(reduction_group=group)
    if states:
        trace.record("scale_update", f"delayed scaling ({mode})", states=len(states))


def backward_update_callback() -> Callable[[], None]:
    """What the first module's backward runs at its end: the backward update of the states its autocast
    registered (captured now, with the current reduction group), whatever autocasts ran forward since."""
    group, in_use = _STATE.amax_reduction_group, _STATE.backward_states
    return lambda: _update_delayed_states("backward", group, in_use)


class autocast:
    """Enable quantized compute with ``recipe`` (default: :func:`get_default_recipe`).

    Nesting is counted; the forward delayed-scaling update runs at the outermost
    exit when grad is enabled. Re-entering an instance that is already active is
    an error, as in TE.
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
        self._saved: Optional[tuple] = None

    def __enter__(self) -> "autocast":
        if self._saved is not None:
            raise RuntimeError("refops.autocast: this context is already active; use a new instance to nest")
        s = _STATE
        self._saved = (s.enabled, s.calibrating, s.recipe, s.amax_reduction_group, s.first_module_claimed)
        if s.depth == 0:
            s.first_module_claimed = False
            s.backward_states = {}  # this autocast's own backward set (the one before is its backward's)
        s.enabled, s.calibrating = self.enabled, self.calibrating
        s.recipe = self.recipe if self.enabled else None
        s.amax_reduction_group = self.amax_reduction_group
        s.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        s = _STATE
        s.depth -= 1
        outermost = s.depth == 0
        if outermost and self.enabled and not self._graph and torch.is_grad_enabled() and exc[0] is None:
            _update_delayed_states("forward", self.amax_reduction_group)
        enabled, calibrating, recipe, group, claimed = self._saved
        s.enabled, s.calibrating, s.recipe, s.amax_reduction_group = enabled, calibrating, recipe, group
        if not outermost:
            s.first_module_claimed = claimed
        self._saved = None


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
        self._saved: Optional[tuple] = None

    def __enter__(self) -> "quantized_model_init":
        s = _STATE
        self._saved = (s.parameters_enabled, s.parameters_recipe, s.high_precision_init_val)
        s.parameters_enabled = self.enabled
        s.parameters_recipe = self.recipe if self.enabled else None
        s.high_precision_init_val = self.preserve
        return self

    def __exit__(self, *exc: object) -> None:
        s = _STATE
        s.parameters_enabled, s.parameters_recipe, s.high_precision_init_val = self._saved
        self._saved = None


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
