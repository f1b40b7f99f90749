"""refops' own ``BasicLinear`` with a weight-cache defect injected, trained a step, then compared.

TE keeps quantized copies of a weight across calls (the FP8 data, its transpose for dgrad) and has
shipped several ways of letting them go stale. Each candidate here is a ``BasicLinear`` whose weight
quantizer is wrapped, inside the candidate only, by a cache with one such defect; its twin keys the
same cache correctly. Because a stale cache needs a previous step, the harness trains the candidate
one step (as a user checking a model mid-training would) before calling ``compare_modules``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase

FEATURES_IN, FEATURES_OUT, BATCH = 64, 32, 32


class _CachingWeightQuantizer:
    """Quantizes the weight afresh, then substitutes cached bytes where the cache policy says they are valid."""

    def __init__(self, op: "CachedWeightLinear", quantizer: Any) -> None:
        object.__setattr__(self, "_op", op)
        object.__setattr__(self, "_quantizer", quantizer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._quantizer, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._quantizer, name, value)

    def __call__(self, tensor: torch.Tensor) -> Any:
        fresh = self._quantizer(tensor)
        self._op.apply_cache(fresh, self._quantizer)
        return fresh


class CachedWeightLinear(te.ops.BasicLinear):
    """``BasicLinear`` with a cache of its quantized weight; ``policy`` says how the cache is keyed."""

    def __init__(self, policy: str) -> None:
        super().__init__(FEATURES_IN, FEATURES_OUT)
        self.policy = policy
        self._cache_key: Optional[tuple] = None
        self._cached: dict[str, torch.Tensor] = {}

    def get_quantizer(self, mode: str, index: int) -> Any:
        quantizer = super().get_quantizer(mode, index)
        if quantizer is None or (mode, index) != ("forward", 1):
            return quantizer
        return _CachingWeightQuantizer(self, quantizer)

    def apply_cache(self, fresh: Any, quantizer: Any) -> None:
        weight = self.weight
        if self.policy in ("keyed_on_storage", "keyed_on_storage_and_version"):
            # TE #1596: the transpose kept for dgrad must be rebuilt after the optimizer step updates the weight
            key = (weight.data_ptr(),) + ((weight._version,) if self.policy.endswith("version") else ())
            self._reuse_transpose(fresh, key, refresh_key_without_transpose=False)
        elif self.policy in ("key_refreshed_by_any_forward", "key_refreshed_with_transpose"):
            # TE #1648: a forward without grad makes no transpose; it must not mark the cache current
            self._reuse_transpose(fresh, (weight._version,),
                                  refresh_key_without_transpose=self.policy == "key_refreshed_by_any_forward")
        else:  # TE #825: the recipe's scale changes while the weight does not; cached bytes need that scale
            # Keyed on whether this cast made the transpose too: a no-grad forward's bytes lack it.
            key = (weight._version, fresh._transpose is not None) + (
                (float(quantizer.scale),) if self.policy == "keyed_on_version_and_scale" else ())
            if key == self._cache_key:
                fresh._data, fresh._transpose = self._cached["data"], self._cached["transpose"]
            else:  # the scale_inv stays the live one: stale bytes decoded with a new scale (the bug)
                self._cache_key = key
                self._cached = {"data": fresh._data, "transpose": fresh._transpose}

    def _reuse_transpose(self, fresh: Any, key: tuple, refresh_key_without_transpose: bool) -> None:
        has_transpose = fresh._transpose is not None
        if key == self._cache_key and "transpose" in self._cached and has_transpose:
            fresh._transpose = self._cached["transpose"]
            return
        if has_transpose:
            self._cached["transpose"] = fresh._transpose
        if has_transpose or refresh_key_without_transpose:
            self._cache_key = key


def _train_then_compare(policy: str, recipe: Any, *, optimizer_step: bool, eval_forward: bool) -> Any:
    torch.manual_seed(0)
    candidate = te.ops.Sequential(CachedWeightLinear(policy))
    reference = te.ops.Sequential(te.ops.BasicLinear(FEATURES_IN, FEATURES_OUT))
    with torch.no_grad():
        reference[0].weight.copy_(candidate[0].weight)
    x, dy = torch.randn(BATCH, FEATURES_IN), torch.randn(BATCH, FEATURES_OUT)
    # The reference takes the same step, so that recipe state (delayed scaling) is at the same point.
    for model in (candidate, reference):
        with te.autocast(recipe=recipe):
            model(x).backward(dy)
        if optimizer_step:
            torch.optim.SGD(model.parameters(), lr=0.05).step()
        if eval_forward:
            with torch.no_grad(), te.autocast(recipe=recipe):
                model(x)
        model.zero_grad(set_to_none=True)
    return compare_modules(candidate, reference, (torch.randn(BATCH, FEATURES_IN),), recipe=recipe)


def _case(name: str, url: str, summary: str, bug: str, fix: str, recipe: Any, **steps: bool) -> RecallCase:
    return RecallCase(name, url, "module", summary, lambda: _train_then_compare(bug, recipe, **steps),
                      lambda: _train_then_compare(fix, recipe, **steps))


CASES = [
    _case("weight_transpose_stale_after_optimizer_step", "https://github.com/NVIDIA/TransformerEngine/pull/1596",
          "the FP8 weight's transpose cache is keyed on its storage, which the optimizer updates in place: "
          "dgrad keeps using last step's weight", "keyed_on_storage", "keyed_on_storage_and_version",
          te.recipe.Float8CurrentScaling(), optimizer_step=True, eval_forward=False),
    _case("weight_transpose_stale_after_no_grad_forward", "https://github.com/NVIDIA/TransformerEngine/pull/1648",
          "a no-grad forward (which makes no transpose) marks the transpose cache current, so the next "
          "training step's dgrad uses the pre-update transpose", "key_refreshed_by_any_forward",
          "key_refreshed_with_transpose", te.recipe.Float8CurrentScaling(), optimizer_step=True, eval_forward=True),
    _case("fp8_weight_bytes_stale_after_scale_update", "https://github.com/NVIDIA/TransformerEngine/pull/825",
          "cached FP8 weight bytes are reused after delayed scaling updated the scale, and decoded with the "
          "new scale_inv", "keyed_on_version", "keyed_on_version_and_scale",
          te.recipe.DelayedScaling(), optimizer_step=False, eval_forward=False),
]
