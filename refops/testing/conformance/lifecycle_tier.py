"""The lifecycle tier of a conformance run: ``check_lifecycle`` on TE's ops, and the same check on
refops' own ops as the control: a property the reference violates too is reported as a limit of the check,
not as a finding about TE; a refops extension is listed, not held against TE."""

from __future__ import annotations

import re
from typing import Optional

from ..lifecycle import Status, check_lifecycle
from ..recipes import make_recipe
from ..transformer_engine import lifecycle_cases
from ..transformer_engine.lifecycle import TE_CLAIMS
from .record import NotRun, Row, TierTable
from .run_setup import Planned, Setup, clip, unsupported_reason

__all__ = ["LIFECYCLE_CRITERION", "plan_lifecycle"]

LIFECYCLE_CRITERION = (
    "`check_lifecycle` on TE's ops (built on meta and materialized by `reset_parameters()`, by "
    "`to_empty()` + `reset_parameters()` and by the first forward; parameters replaced, loaded with "
    "`assign=True`, deep-copied, checkpointed), each property held or violated with its evidence. The same "
    "check runs on refops' own op as the control: a property the reference violates too is a limit of the "
    "check (listed as such), not a finding about TE; a property that is a refops extension (materializing "
    "keeps parameter objects) is listed, not held against TE; a row fails on properties TE alone violates."
)


def plan_lifecycle(setup: Setup) -> tuple[TierTable, list[Planned]]:
    table = TierTable("lifecycle", "Lifecycle tier", LIFECYCLE_CRITERION, ["op", "recipe", "weights", "dtype"])
    recipes: list[Optional[str]] = ([None] if setup.high_precision else []) + list(setup.recipes)
    planned = []
    for recipe_name in recipes:
        why = unsupported_reason(setup, recipe_name) if recipe_name else ""
        if why:
            table.not_run.append(NotRun(f"{recipe_name} (every op)", why))
            continue
        for quantized in ([False, True] if recipe_name else [False]):
            recipe = make_recipe(recipe_name) if recipe_name else None
            cases = lifecycle_cases(recipe, quantized_init=quantized, ops=setup.lifecycle_ops)
            controls = lifecycle_cases(recipe, quantized_init=quantized, ops=setup.lifecycle_ops, reference=True)
            for case, control in zip(cases, controls):
                cells = {"op": case.op, "recipe": recipe_name or "none",
                         "weights": "quantized" if quantized else "high precision",
                         "dtype": str(case.dtype).removeprefix("torch.")}
                planned.append(Planned("lifecycle", cells,
                                       lambda c=case, k=control, cl=cells: _run_lifecycle(setup, c, k, cl)))
    return table, planned


def _run_lifecycle(setup: Setup, case, control, cells: dict[str, str]) -> Row:
    # TE's ops materialize in reset_parameters() and at the first forward (pre_first_fuser_forward): both
    # are TE's own promises, so both are claimed for TE and for the reference alike.
    report = check_lifecycle(case.factory, inputs=case.inputs, device=setup.device, seed=setup.seed, **TE_CLAIMS)
    reference = check_lifecycle(control.factory, inputs=control.inputs, device=setup.device, seed=setup.seed,
                                **TE_CLAIMS)
    findings, shared = [], []
    # A promise refops makes and TE does not: reported, not a verdict.
    extensions = [r.name for r in report.extensions_not_kept]
    for result in report.violations:
        known = set(_clauses(reference[result.name].evidence)) if result.name in reference.statuses and \
            reference[result.name] in reference.violations else set()
        own = [c for c, key in zip(result.evidence.split("; "), _clauses(result.evidence)) if key not in known]
        if own:
            findings.append(f"{result.name}: {clip('; '.join(own))}")
        if len(own) < len(_clauses(result.evidence)):
            shared.append(result.name)
    held = sum(r.status in (Status.HELD, Status.KEPT) for r in report)
    other = len(report.results) - held - len(report.violations)
    if findings:
        evidence = "; ".join(findings)
    else:
        evidence = f"{held} of {len(report.results)} properties held" + (
            f", {other} not applicable or not checked" if other else "")
    if extensions:
        evidence += (f"; refops extensions TE does not promise (not a verdict on TE): {', '.join(extensions)}")
    if shared:
        first = reference[shared[0]].evidence
        evidence += (f"; not a verdict on TE, the reference violates it too: {', '.join(shared)} "
                     f"({clip(first, 200)})")
    details = {
        "te": {r.name: [str(r.status), r.evidence] for r in report},
        "reference": {r.name: [str(r.status), r.evidence] for r in reference},
    }
    return Row(cells, not findings, evidence, details)


_VOLATILE = (
    re.compile(r"\(id 0x[0-9a-f]+( -> 0x[0-9a-f]+)?\)"),  # object ids differ between the two modules
    re.compile(r"\(max \|diff\| [^)]*\)"),  # so do the sizes of a difference
    re.compile(r"(?<=allocated )\d+(?= bytes)"),
)


def _clauses(evidence: str) -> list[str]:
    """The clauses of a property's evidence, without what differs between two runs (ids, sizes): a TE clause
    equal to one of the reference's is the same observation."""
    out = []
    for clause in evidence.split("; "):
        for pattern in _VOLATILE:
            clause = pattern.sub("", clause)
        out.append(" ".join(clause.split()))
    return out
