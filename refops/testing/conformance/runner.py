"""A conformance run from Python: :func:`run_conformance` (or :func:`plan_conformance`, then
:meth:`ConformancePlan.run`), every tier of the oracle with the installed TransformerEngine as the candidate.

``python -m refops conformance`` is this with its options parsed and the record printed; a caller of
:func:`run_conformance` gets the :class:`~.record.ConformanceRecord` to read, print or write.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import pathlib
import subprocess
import time
from typing import Optional, Sequence, Union

import torch


from ...version import __version__
from ..recipes import RECIPE_NAMES, TEST_RECIPES_NOTE, recipe_settings
from ..transformer_engine import LIFECYCLE_OPS, PIPELINES, TransformerEngine, TransformerEngineUnavailable, import_te
from .record import ConformanceRecord, NotRun, TierTable
from .run_setup import DTYPES, QUANTIZER_RECIPES, TIERS, ConformanceError, Planned, Setup, gemm_numerics_function
from .tiers import RECIPE_CHOICES, ProgressCallback, plan_tiers, run_planned

__all__ = ["DeviceInfo", "detect_device", "ConformanceUnavailable", "ConformancePlan", "plan_conformance",
           "run_conformance"]

#: How the import of TE is attributed in its error message (cut off again: the reasons name no caller).
_USER = "run_conformance"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The GPU the run compares on: its name and compute capability."""

    name: str
    capability: tuple[int, int]


class ConformanceUnavailable(ConformanceError):
    """The run cannot start here: no CUDA GPU, no TransformerEngine, an option this refops cannot honour.

    ``reasons`` holds each reason as a sentence (``python -m refops conformance`` prints one per line).
    """

    def __init__(self, reasons: Sequence[str]) -> None:
        self.reasons = list(reasons)
        super().__init__("the conformance run cannot start: " + "; ".join(self.reasons))


def detect_device() -> Union[tuple[torch.device, DeviceInfo], str]:
    """The current CUDA device and its description, or why there is none."""
    if not torch.cuda.is_available():
        return ("checks TransformerEngine on a CUDA GPU, and no CUDA GPU is visible to torch here "
                f"(torch {torch.__version__})")
    device = torch.device("cuda", torch.cuda.current_device())
    return device, DeviceInfo(torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))


@dataclasses.dataclass
class ConformancePlan:
    """Every row a run will compare, per tier, and what the options leave out; :meth:`run` runs it."""

    te: TransformerEngine
    device: torch.device
    device_info: DeviceInfo
    setup: Setup
    #: The tiers' tables, empty until :meth:`run` fills their rows (what each tier leaves out is listed already).
    tables: list[TierTable]
    planned: list[Planned]
    #: What the options left out (tiers, recipes), beyond each tier's own list.
    not_run: list[NotRun]

    def run(self, progress: Optional[ProgressCallback] = None) -> ConformanceRecord:
        """Run every planned row (``progress(done, total, label)`` after each) and return the record.

        A row that raises is a failing row with the error as its evidence; the others still run.
        """
        start = time.perf_counter()
        run_planned(self.tables, self.planned, progress)
        return ConformanceRecord(_environment(self.te.version, self.device, self.device_info, self.setup),
                                 self.tables, list(self.not_run), time.perf_counter() - start)


def plan_conformance(
    *,
    tiers: Optional[Sequence[str]] = None,
    recipes: Optional[Sequence[str]] = None,
    dtypes: Optional[Sequence[str]] = None,
    pipelines: Optional[Sequence[str]] = None,
    ops: Optional[Sequence[str]] = None,
    gemm_numerics: Optional[str] = None,
    seed: int = 0,
    device: Optional[torch.device] = None,
    device_info: Optional[DeviceInfo] = None,
) -> ConformancePlan:
    """Check that the run can start here and plan its rows (see :func:`run_conformance` for the arguments).

    Raises:
        ValueError: an unknown tier, recipe, dtype, pipeline or op, or ``device`` without ``device_info``.
        ConformanceUnavailable: no CUDA GPU (unless ``device`` is given), no TransformerEngine, or
            ``gemm_numerics`` without ``refops.gemm_numerics``; every reason that applies is listed.
    """
    for what, given, known in (("tier", tiers, TIERS), ("recipe", recipes, RECIPE_CHOICES),
                               ("dtype", dtypes, tuple(DTYPES)), ("pipeline", pipelines, tuple(PIPELINES)),
                               ("op", ops, LIFECYCLE_OPS)):
        unknown = [g for g in given or () if g not in known]
        if unknown:
            raise ValueError(f"plan_conformance: unknown {what} {unknown[0]!r}; known: {list(known)}")
    if (device is None) != (device_info is None):
        raise ValueError("plan_conformance: device and device_info go together (the record names the GPU)")
    reasons = []
    if device is None:
        found = detect_device()
        if isinstance(found, str):
            reasons.append(found)
        else:
            device, device_info = found
    try:
        te = import_te(_USER)
    except TransformerEngineUnavailable as error:
        reasons.append(str(error).removeprefix(f"{_USER} "))
    if not reasons and gemm_numerics:
        try:
            gemm_numerics_function()
        except ConformanceError as error:
            reasons.append(str(error))
    if reasons:
        raise ConformanceUnavailable(reasons)
    assert device is not None and device_info is not None
    chosen_recipes = [r for r in RECIPE_NAMES if not recipes or r in recipes]
    setup = Setup(
        te=te,
        device=device,
        capability=tuple(device_info.capability),
        recipes=chosen_recipes,
        high_precision=not recipes or "none" in recipes,
        dtypes=list(dtypes or DTYPES),
        pipelines=list(pipelines or PIPELINES),
        lifecycle_ops=tuple(ops) if ops else None,
        gemm_numerics=gemm_numerics,
        seed=seed,
    )
    chosen_tiers = [t for t in TIERS if not tiers or t in tiers]
    tables, planned = plan_tiers(setup, chosen_tiers)
    not_run = [NotRun(f"{tier} tier", "not selected (--tiers)") for tier in TIERS if tier not in chosen_tiers]
    not_run += [NotRun(name, "not selected (--recipes)") for name in RECIPE_NAMES if name not in chosen_recipes]
    if not setup.high_precision:
        not_run.append(NotRun("high precision (no recipe)", "not selected (--recipes)"))
    return ConformancePlan(te, device, device_info, setup, tables, planned, not_run)


def run_conformance(
    *,
    tiers: Optional[Sequence[str]] = None,
    recipes: Optional[Sequence[str]] = None,
    dtypes: Optional[Sequence[str]] = None,
    pipelines: Optional[Sequence[str]] = None,
    ops: Optional[Sequence[str]] = None,
    gemm_numerics: Optional[str] = None,
    seed: int = 0,
    device: Optional[torch.device] = None,
    device_info: Optional[DeviceInfo] = None,
    progress: Optional[ProgressCallback] = None,
) -> ConformanceRecord:
    """Every tier of the oracle against the installed TransformerEngine on this GPU; the record of what ran.

    Args:
        tiers: of :data:`TIERS` ("quantizers", "modules", "lifecycle"); None: all, in that order.
        recipes: names of ``refops.testing.make_recipe``, "none" for high precision; None: all of them.
        dtypes: the module tier's dtypes ("float32", "bfloat16", "float16"); None: all.
        pipelines: the module tier's pipelines (``refops.testing.transformer_engine.PIPELINES``); None: all.
        ops: the lifecycle tier's TE ops (``LIFECYCLE_OPS``); None: all.
        gemm_numerics: run the reference under ``refops.gemm_numerics(name)`` and report, per tensor of the
            module tier, the share of elements bit-identical between TE and refops.
        seed: the seed of every input and initialization.
        device, device_info: where to compare instead of the current CUDA GPU (with the description the
            record gives it): a stand-in for TE on the CPU is how refops' own tests run it.
        progress: ``progress(done, total, label)`` after each row.

    Raises:
        ValueError, ConformanceUnavailable: as :func:`plan_conformance`.
    """
    plan = plan_conformance(tiers=tiers, recipes=recipes, dtypes=dtypes, pipelines=pipelines, ops=ops,
                            gemm_numerics=gemm_numerics, seed=seed, device=device, device_info=device_info)
    return plan.run(progress)


def _environment(te_version: str, device: torch.device, info: DeviceInfo, setup: Setup) -> dict[str, str]:
    cc = f"{info.capability[0]}.{info.capability[1]}"
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return {
        "TransformerEngine": te_version,
        "GPU": f"{info.name} (compute capability {cc}), {device}",
        "torch": f"{torch.__version__}{cuda}",
        "refops": f"{__version__} ({commit()})",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "reference GEMM numerics": (f"refops.gemm_numerics({setup.gemm_numerics!r})" if setup.gemm_numerics
                                    else "refops' default (--gemm-numerics not given)"),
        "recipes (module and lifecycle tiers)": f"{TEST_RECIPES_NOTE}: " + "; ".join(
            f"{name} = {recipe_settings(name)}" for name in setup.recipes),
        "recipes (quantizer tier)": "; ".join(
            f"{name}: {what}" for name, (base, _, what) in QUANTIZER_RECIPES.items() if base in setup.recipes),
        "seed": str(setup.seed),
    }


def commit() -> str:
    """The git commit of this refops checkout (``REFOPS_COMMIT`` wins: a copy whose ``.git`` is not the
    tree's own, as on a remote GPU machine, would name a wrong one), or "commit unknown" outside one."""
    if os.environ.get("REFOPS_COMMIT"):
        return f"commit {os.environ['REFOPS_COMMIT']}"
    root = pathlib.Path(__file__).resolve().parents[3]  # refops/testing/conformance/ -> the checkout
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else "commit unknown"
