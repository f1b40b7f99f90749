"""What each tier of a module comparison compared, or why it did not run: the limits of a passing report, stated.

Every comparison carries its ``kind`` ("value", "bytes", "state", "consistency", "metamorphic") and the
criterion it was judged by (``tier``); this module counts them by those fields alone.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...recipe import Recipe
from ..tensor_report import TensorComparison
from . import quantized_operands as operands
from .report import TierRun

__all__ = ["describe_tiers"]

NUMERICS_WHY = ("outputs and grads of every scenario step against the reference, each within 4x the distance of a "
                "legitimately different implementation of it (another summation order, TF32 for fp32 GEMMs, FP8 fast "
                "accumulation, one rounding instead of two) and element-wise within 12x that deviation's row x "
                "column profile; each side's distance to a float64 twin reported")


def describe_tiers(results: Sequence[TensorComparison], *, recipe: Optional[Recipe], tier: str, tols: dict,
                   floor: float, exposes: bool, quantized_params: Sequence[str], copied: bool,
                   reference_operands: Sequence[str], has_states: bool, twin_problems: Sequence[str],
                   scenarios: Sequence[str], metamorphic_not_run: Sequence[str], metamorphic: bool
                   ) -> list[TierRun]:
    def of(kind: str) -> list[TensorComparison]:
        return [c for c in results if c.kind == kind]

    byte_checks, state, values = of("bytes"), of("state"), of("value")
    if byte_checks:
        sources = (["quantized parameters"] if quantized_params and not copied else [])
        sources += ["the quantized operands"] if exposes else []
        bytes_why = f"bit-exact data and scales of {' and '.join(sources) or 'quantized tensors'} (the first step)"
    elif recipe is None:
        bytes_why = "no recipe: nothing is quantized"
    else:
        made = ", ".join(reference_operands) or "none"
        bytes_why = (
            "the candidate exposes no quantized operands "
            f"(define {operands.HOOK}(); the reference quantized: {made}), so no quantized byte was compared "
            "and a quantization bug within the criterion passes: check the candidate's quantizer with "
            "refops.testing.check_quantizer"
        )
    if quantized_params and copied:
        bytes_why += ("; quantized parameters are not compared with the reference byte for byte: the reference "
                      "quantized the candidate's values itself (it never takes over quantized arrays), and each "
                      "quantized parameter's copies are checked against each other (the consistency tier)")
    if state:
        state_why = "delayed-scaling scale and amax history of both sides after the first step"
        if any("fed by unequal tensors" in c.name for c in state):
            state_why += ("; the slots of quantizers that saw different tensors on the two sides are held to the "
                          "outputs' criterion instead (named '[slots ..., fed by unequal tensors]')")
    elif not has_states:
        state_why = "the recipe keeps no delayed-scaling state" if recipe is not None else "no recipe"
    else:
        state_why = "the candidate has no refops delayed-scaling state to compare"
    if tier == "numerics":
        num_why = NUMERICS_WHY + ("; " + "; ".join(twin_problems) if twin_problems else "")
    else:
        num_why = f"tier={tier!r} was asked"
    tolerance = [c for c in results if c.tier == "tolerance"]
    if tier == "tolerance":
        tol_why = f"outputs and grads element-wise, rtol={tols['rtol']:g}, atol={tols['atol']:g}"
    elif tolerance:
        tol_why = f"recipe state fed by unequal tensors, rtol={tols['rtol']:g}, atol={tols['atol']:g}"
    else:
        tol_why = f"tier={tier!r} was asked: outputs and grads are judged by it instead"
    sqnr = [c for c in results if c.tier == "sqnr"]
    consistency = of("consistency")
    if consistency:
        cons_why = "the row-wise and column-wise copies of each quantized parameter, before and after the script"
    elif quantized_params:
        cons_why = "no quantized parameter holds both a row-wise and a comparable column-wise copy"
    else:
        cons_why = "the candidate holds no refops quantized parameters"
    meta = of("metamorphic")
    if meta:
        meta_why = "the candidate's first step rerun from a copy: " + ", ".join(sorted({c.name.split(":")[0]
                                                                                         for c in meta}))
        meta_why += "".join(f"; not run: {line}" for line in metamorphic_not_run)
    else:
        meta_why = "metamorphic=False was asked" if not metamorphic else "; ".join(metamorphic_not_run) or "none applied"
    exact_values = [c for c in values if c.tier == "exact"]
    return [
        TierRun("scenarios", True, len(values), "the training script: " + ", ".join(scenarios)),
        TierRun("bytes (exact)", bool(byte_checks), len(byte_checks), bytes_why),
        TierRun("recipe state (exact)", bool(state), len(state), state_why),
        TierRun("consistency", bool(consistency), len(consistency), cons_why),
        TierRun("metamorphic", bool(meta), len(meta), meta_why),
        TierRun("numerics", any(c.tier == "numerics" for c in values), sum(c.tier == "numerics" for c in values),
                num_why),
        TierRun("tolerance", bool(tolerance), len(tolerance), tol_why),
        TierRun("SQNR", bool(sqnr), len(sqnr), f"whole-tensor floor {floor:g} dB"
                + (" (outputs and grads)" if tier == "sqnr" else " (the first step's output)")),
        TierRun("values (exact)", tier == "exact", len(exact_values),
                "outputs and grads bit for bit" if tier == "exact" else f"tier={tier!r} was asked"),
    ]
