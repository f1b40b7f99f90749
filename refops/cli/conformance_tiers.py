"""The three tiers of ``python -m refops conformance``, each as a plan (the rows to run, what is left out and
why) and a run of one row, through the oracle's public functions and :mod:`refops.testing.transformer_engine`.

* quantizer tier: ``check_quantizer`` with TE's quantizer (TE's recipe state for each role) as the
  candidate, for every recipe variant of :data:`QUANTIZER_RECIPES` and role: codes and scales bit
  for bit over the adversarial matrix;
* module tier (:mod:`.conformance_modules`): ``compare_modules`` with a TE ``te.ops`` pipeline as the candidate and its refops
  twin as the reference (same starting values), every recipe, dtype, with and without quantized
  weights, under the module tier's own criterion; with ``--gemm-numerics`` the reference runs under
  ``refops.gemm_numerics(name)`` and each tensor's share of bit-identical elements is reported;
* lifecycle tier (:mod:`.conformance_lifecycle`): ``check_lifecycle`` on TE's ops, and the same check on refops' own ops as the
  control: a property the reference violates too is reported as a limit of the check, not as a
  finding about TE.

The setup every tier shares is :mod:`.conformance_setup`. MXFP8 and NVFP4 need compute capability 10.0 in TE 2.20: below it TE's MXFP8 quantizer returns
garbage and its NVFP4 kernels trap, so those recipes are never compared there, whatever TE answers.
"""

from __future__ import annotations

import torch

from ..recipe import NVFP4BlockScaling, Recipe
from ..testing import check_quantizer
from ..testing.recipes import RECIPE_NAMES
from ..testing.transformer_engine import ROLES, quantizer_candidate
from .conformance_lifecycle import LIFECYCLE_CRITERION, plan_lifecycle
from .conformance_modules import MODULE_CRITERION, plan_modules
from .conformance_record import NotRun, Row, TierTable
from .conformance_setup import (
    DTYPES,
    QUANTIZER_RECIPES,
    TIERS,
    ConformanceError,
    Planned,
    Setup,
    gemm_numerics_function,
    raised_row,
    unsupported_reason,
)
from .progress import Progress

__all__ = [
    "Setup",
    "ConformanceError",
    "QUANTIZER_RECIPES",
    "DTYPES",
    "TIERS",
    "unsupported_reason",
    "gemm_numerics_function",
    "plan_tiers",
    "run_planned",
    "Planned",
    "RECIPE_CHOICES",
    "QUANTIZER_CRITERION",
    "MODULE_CRITERION",
    "LIFECYCLE_CRITERION",
]


def plan_tiers(setup: Setup, tiers: list[str]) -> tuple[list[TierTable], list[Planned]]:
    """The tables (with what each leaves out) and every row to run, in order."""
    tables, planned = [], []
    for tier in tiers:
        table, rows = _PLANS[tier](setup)
        tables.append(table)
        planned += rows
    return tables, planned


def run_planned(tables: list[TierTable], planned: list[Planned], progress: Progress) -> None:
    """Run every planned row into its table; a row that raises is a failing row with the error as evidence."""
    by_tier = {t.tier: t for t in tables}
    for item in planned:
        try:
            row = item.run()
        except Exception as error:  # noqa: BLE001  (one row's crash is that row's evidence)
            row = raised_row(item.cells, error)
        by_tier[item.tier].rows.append(row)
        progress.step(f"{item.tier}: {' '.join(item.cells.values())}: {row.result}")



# ------------------------------------------------------------------- quantizer tier
QUANTIZER_CRITERION = (
    "`check_quantizer` with TE's quantizer as the candidate (made by TE's own recipe state for the role, "
    "so TE's mapping of recipe fields to quantizer options is checked too): every code and every scale of "
    "the adversarial matrix (random values at many scales, zeros, subnormals, ties between codes, values "
    "at and past the format's max, inf and NaN, partial blocks; fp32, fp16 and bf16 inputs; row-wise and "
    "column-wise) compared bit for bit with refops' reference."
)


def _plan_quantizers(setup: Setup) -> tuple[TierTable, list[Planned]]:
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



_PLANS = {"quantizers": _plan_quantizers, "modules": plan_modules, "lifecycle": plan_lifecycle}

#: For the CLI's ``--recipes`` choices.
RECIPE_CHOICES = ("none", *RECIPE_NAMES)
