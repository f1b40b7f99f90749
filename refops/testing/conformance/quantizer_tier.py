"""The quantizer tier of a conformance run: ``check_quantizer`` with TE's quantizer (TE's recipe state for each
role) as the candidate, for every recipe variant of :data:`QUANTIZER_RECIPES` and role: codes and scales bit for
bit over the adversarial matrix."""

from __future__ import annotations

import torch

from ...recipe import NVFP4BlockScaling, Recipe
from ..quantizers import check_quantizer
from ..transformer_engine import ROLES, quantizer_candidate
from .record import NotRun, Row, TierTable
from .run_setup import QUANTIZER_RECIPES, Planned, Setup, unsupported_reason

__all__ = ["QUANTIZER_CRITERION", "plan_quantizers"]

QUANTIZER_CRITERION = (
    "`check_quantizer` with TE's quantizer as the candidate (made by TE's own recipe state for the role, "
    "so TE's mapping of recipe fields to quantizer options is checked too): every code and every scale of "
    "the adversarial matrix (random values at many scales, zeros, subnormals, ties between codes, values "
    "at and past the format's max, inf and NaN, partial blocks; fp32, fp16 and bf16 inputs; row-wise and "
    "column-wise) compared bit for bit with refops' reference."
)


def plan_quantizers(setup: Setup) -> tuple[TierTable, list[Planned]]:
    table = TierTable("quantizers", "Quantizer tier", QUANTIZER_CRITERION,
                      ["recipe", "role", "quantizer", "runs", "codes differ", "scales differ"])
    planned = []
    for name, (base, make, what) in QUANTIZER_RECIPES.items():
        if base not in setup.recipes:
            continue
        why = unsupported_reason(setup, base)
        if why:
            table.not_run.append(NotRun(f"{name} ({what})", why))
            continue
        for role in ROLES:
            recipe = make()
            cells = {"recipe": name, "role": role}
            if _stochastic(recipe, role):
                table.not_run.append(NotRun(f"{name}, {role}", "stochastic rounding draws random bits: "
                                                               "nothing to compare bit for bit"))
                continue
            planned.append(Planned("quantizers", cells, lambda r=recipe, c=cells: _run_quantizer(setup, r, c)))
    return table, planned


def _stochastic(recipe: Recipe, role: str) -> bool:
    return isinstance(recipe, NVFP4BlockScaling) and role == "grad_output" and not recipe.disable_stochastic_rounding


def _run_quantizer(setup: Setup, recipe: Recipe, cells: dict[str, str]) -> Row:
    role = cells["role"]
    torch.manual_seed(setup.seed)
    candidate = quantizer_candidate(recipe, role=role, device=setup.device)
    report = check_quantizer(candidate, recipe, role=role, output="data_and_scale_inv", device=setup.device,
                             seed=setup.seed)
    compared = [r for r in report.runs if r.status in ("ok", "differs", "candidate raised")]
    codes = sum(r.code_mismatches for r in compared)
    elements = sum(r.elements for r in compared)
    scales = sum(r.scale_mismatches for r in compared)
    scale_count = sum(r.scales for r in compared)
    statuses: dict[str, int] = {}
    for r in report.runs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    cells = {**cells, "quantizer": report.reference, "runs": f"{len(compared)}/{len(report.runs)}",
             "codes differ": f"{codes}/{elements}", "scales differ": f"{scales}/{scale_count}"}
    others = ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()) if s != "ok")
    if report.ok:
        evidence = f"{len(compared)} runs bit-identical" + (f"; {others}" if others else "")
    else:
        failing = [f"{r.case}/{r.dtype}/{r.usage}: {r.status}" + (f" ({r.detail})" if r.detail else "")
                   for r in report.failures[:4]]
        more = len(report.failures) - len(failing)
        evidence = "; ".join(failing) + (f"; +{more} more failing runs" if more > 0 else "")
        if report.mismatches:
            evidence += f"; first mismatch: {report.mismatches[0]}"
    details = {"statuses": statuses, "notes": list(report.notes), "recipe": repr(recipe),
               "mismatches": [str(m) for m in report.mismatches]}
    return Row(cells, report.ok, evidence, details)
