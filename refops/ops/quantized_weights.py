"""Weights stored quantized: captured at construction, quantized at materialization.

An op built inside ``refops.quantized_model_init(enabled=True, recipe=R)`` stores
its weights as ``QuantizedTensor`` parameters. The weight quantizer comes from the
op's recipe state; if there is none (for instance the first forward runs
outside ``autocast``, which drops the quantizers), refops uses the recipe ``R``
remembered at construction (beyond TE, which raises). Only when no recipe is
known at all is it an error.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from .. import trace
from ..quantization.quantizer import Quantizer
from ..quantization.recipe_state import RecipeState
from ..quantization.state import (
    get_quantized_parameters_recipe,
    preserve_high_precision_init_val,
    with_quantized_parameters,
)

__all__ = ["QuantizedWeights", "NO_QUANTIZER_MESSAGE"]

NO_QUANTIZER_MESSAGE = (
    "Tried to quantize weight with deferred initialization due to meta device, but no quantizer was available. "
    "This is most likely because the weight was initialized within quantized_model_init, but the forward pass "
    "was not performed within autocast (and no recipe was remembered from construction)."
)


class QuantizedWeights(torch.nn.Module):
    """Mixin for ops with quantizable weights. ``_weight_quantizer_slots`` maps weight names to
    forward quantizer slots."""

    _with_quantized_weight: bool = False
    _quantized_weight_recipe: Any = None
    _keep_high_precision_init_val: bool = False

    def _capture_quantized_model_init(self) -> None:
        """Construction: remember whether (and with which recipe) weights are stored quantized."""
        self._with_quantized_weight = with_quantized_parameters()
        self._quantized_weight_recipe = get_quantized_parameters_recipe()
        self._keep_high_precision_init_val = preserve_high_precision_init_val()
        if self._with_quantized_weight:
            self.reset_recipe_state(recipe=self._quantized_weight_recipe)  # type: ignore[attr-defined]

    def _weight_quantizer_slot(self, name: str) -> Optional[int]:
        """The forward quantizer slot of weight ``name`` (None: not a weight)."""
        raise NotImplementedError

    def _weight_quantizer(self, slot: int) -> Quantizer:
        quantizer = self.get_quantizer("forward", slot)  # type: ignore[attr-defined]
        if quantizer is not None:
            return quantizer.copy()
        if self._quantized_weight_recipe is None:
            raise RuntimeError(f"{type(self).__name__}: {NO_QUANTIZER_MESSAGE}")
        with torch.inference_mode(False):
            state = RecipeState.create(
                self._quantized_weight_recipe,
                mode="forward",
                num_quantizers=self.num_quantizers("forward"),  # type: ignore[attr-defined]
                roles=self.get_quantizer_roles("forward"),  # type: ignore[attr-defined]
                device=self._recipe_state_device(),  # type: ignore[attr-defined]
            )
            return self._label_quantizers(state, [state.make_quantizer(slot)])[0]  # type: ignore[attr-defined]

    def _check_can_materialize(self) -> None:
        """Before anything is materialized: fail early if a weight could not be quantized."""
        if self._with_quantized_weight:
            for name in self._parameters:
                slot = self._weight_quantizer_slot(name)
                if slot is not None:
                    self._weight_quantizer(slot)

    def _finalize_parameter_value(self, name: str, value: torch.Tensor, *, inference: bool) -> torch.Tensor:
        """Quantize a freshly initialized weight: row-wise, and column-wise whenever it could be trained.

        (TE keys column-wise data on grad mode; refops creates it unless in
        inference mode with a weight that does not require grad, so a first
        forward under ``no_grad`` or ``inference_mode`` does not leave a
        trainable weight unusable for backward.) Keeps a CPU copy of the
        high-precision values only if ``preserve_high_precision_init_val`` asked.
        """
        slot = self._weight_quantizer_slot(name)
        if not self._with_quantized_weight or slot is None:
            return value
        param = self._parameters.get(name)
        trainable = param is None or param.requires_grad
        quantizer = self._weight_quantizer(slot)
        quantizer.set_usage(rowwise=True, columnwise=trainable or not inference)
        quantizer.internal = False
        quantized = quantizer(value)
        trace.record(
            "quantize_weight",
            f"{type(self).__name__}.{name}",
            instance=self,
            format=type(quantized).__name__,
            recipe=trace.recipe_name(self._quantized_weight_recipe),
            usages=[u for u in ("rowwise", "columnwise") if getattr(quantizer, f"{u}_usage")],
        )
        if self._keep_high_precision_init_val:
            self.__dict__.setdefault("_high_precision_init_vals", {})[name] = value.detach().to("cpu", copy=True)
        return quantized

    def get_high_precision_init_val(self, name: str = "weight") -> Optional[torch.Tensor]:
        """The CPU copy of weight ``name``'s initial high-precision values, if kept."""
        return self.__dict__.get("_high_precision_init_vals", {}).get(name)

    def clear_high_precision_init_val(self) -> None:
        """Free the kept high-precision initial values."""
        self.__dict__.pop("_high_precision_init_vals", None)
