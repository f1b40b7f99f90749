"""The judges of the module tier: one recorded tensor of the candidate against the reference's, by one criterion.

``tier="numerics"`` (the default) judges with the reference's twins (:mod:`.numerics`); ``"tolerance"``,
``"sqnr"`` and ``"exact"`` by :func:`~refops.testing.compare_tensors`. A tensor one side has and the other
does not is a failure that says which side lacks it, never a made-up comparison of values.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from . import numerics
from .scenarios import Key
from ..tensor_report import TensorComparison, absent, compare_tensors

__all__ = ["candidate_raised", "display_name", "missing", "judge_numerics", "judge_by_tier"]


def display_name(key: Key) -> str:
    """``"output"`` for the first step; ``"<scenario>, <step>: <tensor>"`` (or ``"<scenario>: <tensor>"``) after."""
    scenario, step, tensor = key
    if scenario == "one step":
        return tensor
    return f"{scenario}, {step}: {tensor}" if step else f"{scenario}: {tensor}"


def _located(result: TensorComparison, key: Key, kind: str = "value") -> TensorComparison:
    return dataclasses.replace(result, name=display_name(key), kind=kind, scenario=key[0], step=key[1])


def missing(key: Key, which: str, tier: str) -> TensorComparison:
    """A failure: ``which`` side ("the candidate" / "the reference") produced no such tensor."""
    result = absent(display_name(key), f"{which} has no {key[2]} (None) where the other side has one: a grad that "
                    f"was not computed or a tensor that was not produced", tier=tier)
    return _located(result, key)


def candidate_raised(failure: str) -> TensorComparison:
    """A failure: the candidate raised during the script (``failure``: where and what); the script went on without
    it, so what it would have produced after that is not compared."""
    return dataclasses.replace(absent("the candidate ran the script", f"the candidate raised {failure}",
                                      criterion="every step runs"), kind="value")


def _as_f64(t: torch.Tensor) -> torch.Tensor:
    return (t.dequantize() if isinstance(t, QuantizedTensor) else t).detach().double()


def judge_numerics(key: Key, candidate: torch.Tensor, reference: torch.Tensor, legit: Optional[torch.Tensor],
                   high: Optional[torch.Tensor], unquantized: Optional[torch.Tensor], *, quantized: bool
                   ) -> TensorComparison:
    """The numerics criterion (:func:`.numerics.judge`) of one recorded tensor."""
    if legit is None or tuple(legit.shape) != tuple(reference.shape):
        # No legitimately different run: the reference's own distance to float64 stands in for its spread.
        legit = 2 * _as_f64(reference) - high.double().cpu() if high is not None else reference
    after_an_update = key[0] == "training" and key[1] != "step 1"
    result = numerics.judge(key[2], candidate, reference, legit, high, quantized=quantized, unquantized=unquantized,
                            mean_shift=not after_an_update)
    return _located(result, key)


def judge_by_tier(key: Key, candidate: torch.Tensor, reference: torch.Tensor, check: dict) -> TensorComparison:
    """One recorded tensor by ``tolerance`` / ``sqnr`` / ``exact`` (``check``: compare_tensors' keywords)."""
    result = compare_tensors(key[2], candidate, reference, **check)
    result = dataclasses.replace(result, bit_identical_share=numerics.bit_identical_share(candidate, reference))
    return _located(result, key)
