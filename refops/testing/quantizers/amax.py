"""The amax a candidate gives, in either of the two ways it can, against the reference's, bit for bit.

Per-tensor FP8 quantizers record ``max |x|`` (NaN skipped) in ``quantizer.amax``:
delayed scaling max-accumulates it into the history that sets the *next* scale,
so a kernel that records it wrong (without ``abs``, with NaN) passes every code
and scale of this step and corrupts the training run later. NVFP4 stores a
global amax in the tensor. A candidate provides the amax

* by **returning** it: ``(data, scale_inv, amax)``, a dict with ``"amax"``, or an
  NVFP4 ``QuantizedTensor``;
* by **recording** it in the quantizer it is given (``quantizer.amax``, which
  :func:`~refops.testing.check_quantizer` sets to zero before each call).

Both are compared wherever given. A candidate that records in some runs is held
to it in every run (a run where ``quantizer.amax`` stayed zero while the input's
amax is not zero differs). Where it provides neither, the report says the amax
was not compared.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import torch

from ...quantization import Float8CurrentScalingQuantizer, Float8Quantizer, NVFP4Quantizer, Quantizer
from . import layout

__all__ = ["AmaxEvidence", "records_amax", "reset_recorded", "recorded", "compare", "describe"]

RETURNED = "returned"
RECORDED = "recorded in quantizer.amax"


def records_amax(quantizer: Quantizer) -> bool:
    """Whether the scheme keeps an amax in the quantizer (per-tensor FP8: delayed and current scaling)."""
    return isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer))


def reset_recorded(quantizer: Quantizer) -> Optional[torch.Tensor]:
    """Zero the quantizer's amax before a call (a copied quantizer may hold an earlier cast's);
    returns the buffer, to tell afterwards whether the candidate wrote or rebound it."""
    if not records_amax(quantizer):
        return None
    quantizer.amax = torch.zeros(1, dtype=torch.float32, device=quantizer.amax.device)
    return quantizer.amax


def recorded(quantizer: Quantizer, before: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """The amax the candidate recorded, or None when ``quantizer.amax`` is the zero buffer it was given."""
    if before is None:
        return None
    now = getattr(quantizer, "amax", None)
    if not isinstance(now, torch.Tensor):
        return None
    if now is before and now.numel() == 1 and float(now.reshape(-1)[0]) == 0.0 and not now.signbit().any():
        return None
    return now


@dataclasses.dataclass
class AmaxEvidence:
    """What one check saw of the amax: how often it was given each way, and where it was expected."""

    expected_somewhere: bool = False
    returned_runs: int = 0
    recorded_runs: int = 0
    #: Runs where nothing was recorded, as ``(index in the run list, expected amax as a float)``.
    unrecorded: list[tuple[int, float]] = dataclasses.field(default_factory=list)
    returned_but_unused: bool = False


def _bits_equal(got: Any, expected: torch.Tensor) -> bool:
    got = torch.as_tensor(got).detach().float().cpu().reshape(-1)
    expected = expected.detach().float().cpu().reshape(-1)
    return got.shape == expected.shape and torch.equal(layout.as_bits(got), layout.as_bits(expected))


def _show(t: Any) -> str:
    values = torch.as_tensor(t).detach().float().cpu().reshape(-1).tolist()
    return repr(values[0]) if len(values) == 1 else repr(values)


def compare(expected: Optional[torch.Tensor], returned: Any, recorded_amax: Optional[torch.Tensor],
            evidence: AmaxEvidence, run_index: int) -> list[str]:
    """Compare what the candidate gave with ``expected`` (None: the scheme has no amax); one sentence per
    difference. Updates ``evidence``."""
    if expected is None:
        if returned is not None:
            evidence.returned_but_unused = True
        return []
    evidence.expected_somewhere = True
    problems = []
    for how, value in ((RETURNED, returned), (RECORDED, recorded_amax)):
        if value is None:
            continue
        if how == RETURNED:
            evidence.returned_runs += 1
        else:
            evidence.recorded_runs += 1
        if not _bits_equal(value, expected):
            problems.append(f"amax {how} {_show(value)} != expected {_show(expected)}")
    if recorded_amax is None:
        evidence.unrecorded.append((run_index, float(expected.detach().float().reshape(-1)[0])))
    return problems


def describe(quantizer: Quantizer, evidence: AmaxEvidence, *, can_return: bool, can_record: bool) -> tuple[
        list[str], list[str]]:
    """``(compared, not_compared)`` sentences for the report. ``can_return``: the output convention has room
    for an amax (not dequantized values); ``can_record``: the candidate is given the quantizer."""
    compared, not_compared = [], []
    if evidence.returned_but_unused:
        not_compared.append(f"the returned amax was not compared: {type(quantizer).__name__} keeps no amax")
    if not evidence.expected_somewhere:
        return compared, not_compared
    ways = []
    if evidence.returned_runs:
        ways.append(f"returned ({evidence.returned_runs} runs)")
    if evidence.recorded_runs:
        ways.append(f"recorded in quantizer.amax ({evidence.recorded_runs} runs; held to it in every run)")
    if ways:
        compared.append(f"amax, bit for bit: {' and '.join(ways)}")
        return compared, not_compared
    if isinstance(quantizer, Float8Quantizer):
        why = "delayed scaling's next scale comes from it"
    elif isinstance(quantizer, NVFP4Quantizer):
        why = "NVFP4's global amax; the block scales derived from it were compared"
    else:
        why = "the scale_inv computed from it was compared"
    ways = (["return (data, scale_inv, amax) or a dict with 'amax'"] if can_return else []) + (
        ["record it in quantizer.amax"] if can_record and records_amax(quantizer) else [])
    how = f"; to check it, {' or '.join(ways)}" if ways else ""
    not_compared.append(f"amax not compared: the candidate never provided it ({why}){how}")
    return compared, not_compared
