"""The three tiers of a conformance run, each as a plan (the rows to run, what is left out and why) and a run of
one row, through the oracle's public functions and :mod:`refops.testing.transformer_engine`.

* quantizer tier (:mod:`.quantizer_tier`): ``check_quantizer`` with TE's quantizer (TE's recipe state for each
  role) as the candidate, for every recipe variant of :data:`QUANTIZER_RECIPES` and role: codes and scales bit
  for bit over the adversarial matrix;
* module tier (:mod:`.module_tier`): ``compare_modules`` with a TE ``te.ops`` pipeline as the candidate and its
  refops twin as the reference (same starting values), every recipe, dtype, with and without quantized
  weights, under the module tier's own criterion; with ``gemm_numerics`` the reference runs under
  ``refops.gemm_numerics(name)`` and each tensor's share of bit-identical elements is reported;
* lifecycle tier (:mod:`.lifecycle_tier`): ``check_lifecycle`` on TE's ops, and the same check on refops' own ops
  as the control: a property the reference violates too is reported as a limit of the check, not as a
  finding about TE.

The setup every tier shares is :mod:`.run_setup`. MXFP8 and NVFP4 need compute capability 10.0 in TE 2.20: below
it TE's MXFP8 quantizer returns garbage and its NVFP4 kernels trap, so those recipes are never compared there,
whatever TE answers.
"""

from __future__ import annotations

from typing import Callable, Optional

from ..recipes import RECIPE_NAMES
from .lifecycle_tier import LIFECYCLE_CRITERION, plan_lifecycle
from .module_tier import MODULE_CRITERION, plan_modules
from .quantizer_tier import QUANTIZER_CRITERION, plan_quantizers
from .record import TierTable
from .run_setup import (
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
    "ProgressCallback",
    "RECIPE_CHOICES",
    "QUANTIZER_CRITERION",
    "MODULE_CRITERION",
    "LIFECYCLE_CRITERION",
]

#: ``progress(done, total, label)``, called after each row (``label``: the row's tier, cells and result).
ProgressCallback = Callable[[int, int, str], None]

#: The recipe names a run takes ("none": high precision).
RECIPE_CHOICES = ("none", *RECIPE_NAMES)


def plan_tiers(setup: Setup, tiers: list[str]) -> tuple[list[TierTable], list[Planned]]:
    """The tables (with what each leaves out) and every row to run, in order."""
    tables, planned = [], []
    for tier in tiers:
        table, rows = _PLANS[tier](setup)
        tables.append(table)
        planned += rows
    return tables, planned


def run_planned(tables: list[TierTable], planned: list[Planned], progress: Optional[ProgressCallback] = None) -> None:
    """Run every planned row into its table; a row that raises is a failing row with the error as evidence."""
    by_tier = {t.tier: t for t in tables}
    for done, item in enumerate(planned, 1):
        try:
            row = item.run()
        except Exception as error:  # noqa: BLE001  (one row's crash is that row's evidence)
            row = raised_row(item.cells, error)
        by_tier[item.tier].rows.append(row)
        if progress is not None:
            progress(done, len(planned), f"{item.tier}: {' '.join(item.cells.values())}: {row.result}")


_PLANS = {"quantizers": plan_quantizers, "modules": plan_modules, "lifecycle": plan_lifecycle}
