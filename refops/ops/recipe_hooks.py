"""A basic op's quantization hooks: quantizer slots, roles, and ``reset_recipe_state``.

Each op declares how many quantizers it uses per mode ("forward", "backward")
and their roles; ``reset_recipe_state(recipe=R)`` builds one
:class:`~refops.quantization.recipe_state.RecipeState` per mode and its
quantizers. A recipe of the same type keeps the state (delayed-scaling amax
histories survive) and rebuilds the quantizers when any option changed (beyond
TE, which keeps them); a different type rebuilds it; ``None`` drops it.
"""

from __future__ import annotations

import warnings
from typing import Any, Optional

import torch

from ..quantization.quantizer import Quantizer, QuantizerRole
from ..quantization.recipe_state import DelayedScalingRecipeState, RecipeState
from ..recipe import Recipe

__all__ = ["QuantizationHooks", "MODES"]

MODES = ("forward", "backward")


class QuantizationHooks(torch.nn.Module):
    """Mixin for :class:`~refops.ops.op.BasicOperation` (TE's hook names and semantics)."""

    _recipe_states: Optional[dict[str, Optional[RecipeState]]] = None
    _quantizers: Optional[dict[str, list[Quantizer]]] = None

    def num_quantizers(self, mode: str) -> int:
        """Number of quantizer slots in ``mode`` ("forward" or "backward")."""
        return 0

    def get_quantizer_roles(self, mode: str) -> Optional[list[QuantizerRole]]:
        """One role per quantizer slot, or None (treated as input / grad_output)."""
        return None

    def get_quantizer(self, mode: str, index: int) -> Optional[Quantizer]:
        if self._quantizers is None:
            return None
        return self._quantizers[mode][index]

    def get_input_quantizer(self) -> Optional[Quantizer]:
        if self._quantizers is None:  # no recipe: asked twice per op per forward, so answered first
            return None
        return self.get_quantizer("forward", 0) if self.num_quantizers("forward") > 0 else None

    def get_grad_output_quantizer(self) -> Optional[Quantizer]:
        if self._quantizers is None:
            return None
        return self.get_quantizer("backward", 0) if self.num_quantizers("backward") > 0 else None

    @property
    def recipe(self) -> Optional[Recipe]:
        """The recipe the op's quantizers were built for, or None."""
        states = self._recipe_states or {}
        for state in states.values():
            if state is not None:
                return state.recipe
        return None

    def _recipe_state_device(self) -> torch.device:
        for p in self.parameters(recurse=False):
            if not p.is_meta:
                return p.device
        try:
            return self.materialization_device()  # type: ignore[attr-defined]
        except (AttributeError, RuntimeError):
            return torch.get_default_device()

    def reset_recipe_state(self, *, recipe: Optional[Recipe]) -> None:
        """Make this op's quantizers match ``recipe`` (see the module docstring).

        Invariant: afterwards ``get_quantizer(mode, i)`` is a quantizer of
        ``recipe``'s scheme for every slot (None when ``recipe`` is None).
        """
        if recipe is None:
            self._recipe_states = None
            self._quantizers = None
            return
        states = self._recipe_states
        same_type = states is not None and all(s is None or isinstance(s.recipe, type(recipe)) for s in states.values())
        if not same_type:
            self._warn_if_discarding_state(recipe)
            self._build_recipe_states(recipe)
            return
        # Same type: the state (delayed-scaling history) carries over; quantizers follow new options.
        options_changed = getattr(self, "_recipe_options", None) != recipe._options_key()
        self._recipe_options = recipe._options_key()
        for mode, state in states.items():
            if state is None:
                continue
            history_changed = (
                isinstance(state, DelayedScalingRecipeState)
                and state.amax_history.shape[0] != recipe.amax_history_len
            )
            state.recipe = recipe
            if history_changed:
                state.resize_history(recipe.amax_history_len)
            if history_changed or options_changed:
                with torch.inference_mode(False):
                    self._quantizers[mode] = self._label_quantizers(state, state.make_quantizers())

    def _build_recipe_states(self, recipe: Recipe) -> None:
        """One state and its quantizers per mode; their tensors are ordinary even under inference_mode,
        so a later training step can update them in place (TE's training-loop tests rely on this)."""
        with torch.inference_mode(False):
            self._build_recipe_states_impl(recipe)

    def _build_recipe_states_impl(self, recipe: Recipe) -> None:
        self._recipe_options = recipe._options_key()
        device = self._recipe_state_device()
        self._recipe_states, self._quantizers = {}, {}
        for mode in MODES:
            n = self.num_quantizers(mode)
            if n == 0:
                self._recipe_states[mode], self._quantizers[mode] = None, []
                continue
            state = RecipeState.create(
                recipe, mode=mode, num_quantizers=n, roles=self.get_quantizer_roles(mode), device=device
            )
            self._recipe_states[mode] = state
            self._quantizers[mode] = self._label_quantizers(state, state.make_quantizers())

    def _label_quantizers(self, state: RecipeState, quantizers: list[Quantizer]) -> list[Quantizer]:
        """Name each quantizer after this op and the tensor it quantizes, for its error messages."""
        for index, quantizer in enumerate(quantizers):
            quantizer.label = f"{type(self).__name__} ({state.mode} quantizer {index}: {state.tensor_type(index)})"
        return quantizers

    def _warn_if_discarding_state(self, recipe: Recipe) -> None:
        old = [s for s in (self._recipe_states or {}).values() if isinstance(s, DelayedScalingRecipeState)]
        if any(bool((s.amax_history != 0).any()) for s in old):
            warnings.warn(
                f"{type(self).__name__}: switching from DelayedScaling to {type(recipe).__name__} discards the "
                "amax history and scales (recipe state cannot carry over between recipe types)",
                UserWarning,
                stacklevel=3,
            )

    # ------------------------------------------------------------ checkpoints
    def _recipe_extra_state(self) -> dict[str, Any]:
        """Delayed-scaling scales and histories (other recipes are stateless)."""
        states = self._recipe_states or {}
        delayed = {m: s for m, s in states.items() if isinstance(s, DelayedScalingRecipeState)}
        if not delayed:
            return {}
        recipe = next(iter(delayed.values())).recipe
        return {
            "recipe": {
                "type": type(recipe).__name__,
                "margin": recipe.margin,
                "fp8_format": recipe.fp8_format.name,
                "amax_history_len": recipe.amax_history_len,
                "amax_compute_algo": recipe.amax_compute_algo if isinstance(recipe.amax_compute_algo, str) else None,
                "reduce_amax": recipe.reduce_amax,
            },
            "states": {m: s.state_dict() for m, s in delayed.items()},
        }

    def _load_recipe_extra_state(self, state: dict[str, Any]) -> None:
        if not state:
            return
        from ..recipe import DelayedScaling, Format

        saved = state["recipe"]
        if saved["type"] != "DelayedScaling":
            raise ValueError(f"{type(self).__name__}: unknown saved recipe type {saved['type']!r}")
        current = self._recipe_states or {}
        if not any(isinstance(s, DelayedScalingRecipeState) for s in current.values()):
            kwargs = dict(
                margin=saved["margin"],
                fp8_format=Format[saved["fp8_format"]],
                amax_history_len=saved["amax_history_len"],
                reduce_amax=saved["reduce_amax"],
            )
            if saved["amax_compute_algo"] is not None:
                kwargs["amax_compute_algo"] = saved["amax_compute_algo"]
            self.reset_recipe_state(recipe=DelayedScaling(**kwargs))
        for mode, tensors in state["states"].items():
            target = self._recipe_states[mode]
            target.load_state_dict(tensors)
            self._quantizers[mode] = self._label_quantizers(target, target.make_quantizers())
