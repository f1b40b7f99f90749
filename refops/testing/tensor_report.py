"""Comparing two tensors under one of the three tiers, with a report of where and by how much they differ.

The three-tier policy (``docs/oracle.md#three-tiers-of-comparison``):

* ``"exact"``: bit-exact; quantized bytes, scales, amax, recipe state;
* ``"tolerance"``: ``|a - e| <= atol + rtol * |e|`` element-wise; GEMM results,
  with the recipe's (or dtype's) tolerance;
* ``"sqnr"``: signal-to-quantization-noise ratio of the whole tensor at least
  a floor in dB; end-to-end sanity.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Optional

import torch

from ..quantization.quantized_tensor import QuantizedTensor

__all__ = ["TensorComparison", "absent", "compare_tensors", "sqnr_db"]

TIERS = ("exact", "tolerance", "sqnr")


def sqnr_db(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``10 log10(sum e^2 / sum (a - e)^2)`` in float64; inf when they are equal."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    noise = (a - e).square().sum().item()
    signal = e.square().sum().item()
    if noise == 0:
        return math.inf
    if signal == 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


@dataclasses.dataclass(frozen=True)
class TensorComparison:
    """How ``actual`` compares with ``expected`` (both seen as float64 values, or raw bytes for "exact")."""

    name: str
    tier: str
    passed: bool
    max_abs_error: float
    max_rel_error: float
    sqnr_db: float
    num_mismatches: int
    numel: int
    first_mismatches: tuple[tuple[int, ...], ...]
    criterion: str
    #: The share of elements bit-identical between the two sides (None where not compared as values).
    bit_identical_share: Optional[float] = None
    #: Under the module tier's "numerics" criterion: each side's SQNR (dB) against the float64 twin.
    candidate_to_float64_db: Optional[float] = None
    reference_to_float64_db: Optional[float] = None
    #: Under the "tolerance" tier: how much of its bound the worst element uses, the largest
    #: ``|a - e| / (atol + rtol * |e|)`` (at most 1 passes; inf for a NaN on one side only). None in other tiers.
    tolerance_used: Optional[float] = None
    #: For a failure: one line of diagnosis, starting "why:".
    why: str = ""
    #: Under the module tier: what was compared ("value", "bytes", "state", "consistency", "metamorphic") and
    #: the scenario and step of the training script that produced it ("" for a single comparison).
    kind: str = ""
    scenario: str = ""
    step: str = ""

    def __str__(self) -> str:
        status = "ok  " if self.passed else "FAIL"
        where = f", first at {list(self.first_mismatches)}" if self.num_mismatches else ""
        share = "" if self.bit_identical_share is None else f" bit-identical={100 * self.bit_identical_share:.1f}%"
        if self.num_mismatches or self.passed:
            counted = f"mismatches={self.num_mismatches}/{self.numel}{where}"
        else:  # a whole-tensor criterion failed: no single element is out of its bound
            counted = f"whole tensor ({self.numel} elements) out of the criterion, no single element"
        sqnr = "identical" if math.isinf(self.sqnr_db) and self.sqnr_db > 0 else f"sqnr={self.sqnr_db:.1f}dB"
        line = (
            f"{status} {self.name:<28} {self.tier:<9} max_abs={self.max_abs_error:.3e} "
            f"max_rel={self.max_rel_error:.3e} {sqnr} {counted}{share} [{self.criterion}]"
        )
        return line + (f"\n       {self.why}" if self.why and not self.passed else "")


def absent(name: str, why: str, *, tier: str = "exact", criterion: str = "present on both sides") -> TensorComparison:
    """A failure where one side has no such tensor: nothing is compared (no fabricated values), ``why`` says
    which side lacks it."""
    return TensorComparison(name=name, tier=tier, passed=False, max_abs_error=math.nan, max_rel_error=math.nan,
                            sqnr_db=math.nan, num_mismatches=0, numel=0, first_mismatches=(),
                            criterion=criterion, why=f"why: {why}")


def _values(t: torch.Tensor) -> torch.Tensor:
    if isinstance(t, QuantizedTensor):
        t = t.dequantize()
    return t.detach().to("cpu", torch.float64)


def compare_tensors(
    name: str,
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    tier: str,
    rtol: float = 0.0,
    atol: float = 0.0,
    sqnr_floor_db: Optional[float] = None,
    max_reported: int = 5,
) -> TensorComparison:
    """Compare under ``tier``; shapes must match (a mismatch is reported as a failure, not raised)."""
    if tier not in TIERS:
        raise ValueError(f"unknown tier {tier!r}; tiers are {TIERS}")
    if tier == "sqnr" and sqnr_floor_db is None:
        raise ValueError("the 'sqnr' tier needs sqnr_floor_db")
    a, e = _values(actual), _values(expected)
    if a.shape != e.shape:
        return TensorComparison(
            name, tier, False, math.inf, math.inf, -math.inf, max(a.numel(), e.numel()),
            max(a.numel(), e.numel()), (), f"shape {tuple(a.shape)} != expected {tuple(e.shape)}",
        )
    diff = (a - e).abs()
    both_nan = torch.isnan(a) & torch.isnan(e)
    diff = torch.where(both_nan, torch.zeros_like(diff), diff)
    rel = diff / e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    if tier == "exact":
        mismatch = (a != e) & ~both_nan
        mismatch |= torch.signbit(a) != torch.signbit(e)
        criterion = "bit-exact values"
        tolerance_used = None
    else:
        bound = atol + rtol * e.abs()
        mismatch = diff > bound
        one_nan = torch.isnan(a) != torch.isnan(e)
        mismatch |= one_nan
        criterion = f"rtol={rtol:g}, atol={atol:g}"
        used = torch.where(diff == 0, torch.zeros_like(diff), diff / bound)  # x / 0 = inf: out of a zero bound
        used = torch.where(one_nan, torch.full_like(used, math.inf), used)
        tolerance_used = float(used.max().item()) if used.numel() else 0.0
    quality = sqnr_db(torch.where(both_nan, 0, a), torch.where(both_nan, 0, e))
    passed = not bool(mismatch.any())
    if tier == "sqnr":  # a whole-tensor criterion: no element is a "mismatch"
        passed = quality >= sqnr_floor_db
        criterion = f"SQNR >= {sqnr_floor_db:g} dB"
        mismatch = torch.zeros_like(mismatch)
        tolerance_used = None
    indices = torch.nonzero(mismatch)[:max_reported]
    return TensorComparison(
        name=name,
        tier=tier,
        passed=passed,
        max_abs_error=float(diff.max().item()) if diff.numel() else 0.0,
        max_rel_error=float(rel.max().item()) if rel.numel() else 0.0,
        sqnr_db=quality,
        num_mismatches=int(mismatch.sum().item()),
        numel=a.numel(),
        first_mismatches=tuple(tuple(int(i) for i in idx) for idx in indices.tolist()),
        criterion=criterion,
        tolerance_used=tolerance_used,
    )
