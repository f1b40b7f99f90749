"""``refops conformance``: every tier of the oracle against the TransformerEngine installed on this GPU.

One table per tier (quantizers, modules, lifecycle; :mod:`refops.cli.conformance_tiers`), each
row pass or fail with its evidence, TE's version, the GPU, and what was not run and why. The
record is printed as Markdown and, with ``--out DIR``, written to ``DIR/conformance.md`` and
``DIR/conformance.json``. A progress bar goes to stderr when it is a terminal.

Exit status: 0 when every row passes, 1 when a row fails, 2 when the run cannot start (no
TransformerEngine, no CUDA GPU, an option this refops cannot honour), with a one-line reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import subprocess
import sys
import time
from typing import Optional, Union

import torch

import refops

from ..testing.recipes import RECIPE_NAMES
from ..testing.transformer_engine import (
    LIFECYCLE_OPS,
    PIPELINES,
    TransformerEngineUnavailable,
    import_te,
)
from .conformance_record import ConformanceRecord, NotRun
from .conformance_tiers import (
    DTYPES,
    QUANTIZER_RECIPES,
    RECIPE_CHOICES,
    TIERS,
    ConformanceError,
    Setup,
    gemm_numerics_function,
    plan_tiers,
    run_planned,
)
from .progress import Progress
from .recipe_settings import TEST_RECIPES_NOTE, recipe_settings

__all__ = ["add_parser", "run", "DeviceInfo", "detect_device"]

PREFIX = "refops conformance"


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """The GPU the run compares on: its name and compute capability."""

    name: str
    capability: tuple[int, int]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conformance",
        help="check the installed TransformerEngine against refops on this GPU, every tier of the oracle",
        description="Run the oracle's quantizer, module and lifecycle tiers with TransformerEngine as the "
                    "candidate, on this machine's CUDA GPU. Needs TransformerEngine "
                    "(pip install --no-build-isolation transformer_engine[pytorch]).",
    )
    p.add_argument("--tiers", nargs="+", choices=TIERS, default=list(TIERS), help="only these tiers")
    p.add_argument("--recipes", nargs="+", choices=RECIPE_CHOICES,
                   help="only these recipes ('none': high precision); default: all of them")
    p.add_argument("--dtypes", nargs="+", choices=list(DTYPES), help="module tier: only these dtypes")
    p.add_argument("--pipelines", nargs="+", choices=sorted(PIPELINES), help="module tier: only these pipelines")
    p.add_argument("--ops", nargs="+", choices=LIFECYCLE_OPS, help="lifecycle tier: only these TE ops")
    p.add_argument("--gemm-numerics", choices=("exact", "hopper"),
                   help="run the reference under refops.gemm_numerics(NAME) and report, per tensor of the "
                        "module tier, the share of elements bit-identical between TE and refops")
    p.add_argument("--out", metavar="DIR", help="write conformance.md and conformance.json into DIR")
    p.add_argument("--seed", type=int, default=0, help="the seed of every input and initialization (default 0)")
    p.set_defaults(func=run)


def detect_device() -> Union[tuple[torch.device, DeviceInfo], str]:
    """The current CUDA device and its description, or why there is none."""
    if not torch.cuda.is_available():
        return ("checks TransformerEngine on a CUDA GPU, and no CUDA GPU is visible to torch here "
                f"(torch {torch.__version__})")
    device = torch.device("cuda", torch.cuda.current_device())
    return device, DeviceInfo(torch.cuda.get_device_name(device), tuple(torch.cuda.get_device_capability(device)))


def run(args: argparse.Namespace, *, device: Optional[torch.device] = None,
        device_info: Optional[DeviceInfo] = None) -> int:
    """Run the conformance; ``device`` and ``device_info`` replace the GPU's (tests run it on the CPU)."""
    reasons = []
    if device is None:
        found = detect_device()
        if isinstance(found, str):
            reasons.append(found)
        else:
            device, device_info = found
    try:
        te = import_te(PREFIX)
    except TransformerEngineUnavailable as error:
        reasons.append(str(error).removeprefix(f"{PREFIX} "))
    if not reasons and args.gemm_numerics:
        try:
            gemm_numerics_function()
        except ConformanceError as error:
            reasons.append(str(error))
    if reasons:
        for reason in reasons:
            print(f"{PREFIX}: {reason}", file=sys.stderr)
        return 2
    assert device is not None and device_info is not None
    recipes = [r for r in RECIPE_NAMES if not args.recipes or r in args.recipes]
    setup = Setup(
        te=te,
        device=device,
        capability=tuple(device_info.capability),
        recipes=recipes,
        high_precision=not args.recipes or "none" in args.recipes,
        dtypes=list(args.dtypes or DTYPES),
        pipelines=list(args.pipelines or PIPELINES),
        lifecycle_ops=tuple(args.ops) if args.ops else None,
        gemm_numerics=args.gemm_numerics,
        seed=args.seed,
    )
    tiers = [t for t in TIERS if t in args.tiers]
    start = time.perf_counter()
    tables, planned = plan_tiers(setup, tiers)
    progress = Progress(len(planned))
    run_planned(tables, planned, progress)
    progress.close()
    not_run = [NotRun(f"{tier} tier", "not selected (--tiers)") for tier in TIERS if tier not in tiers]
    not_run += [NotRun(name, "not selected (--recipes)") for name in RECIPE_NAMES if name not in recipes]
    if not setup.high_precision:
        not_run.append(NotRun("high precision (no recipe)", "not selected (--recipes)"))
    record = ConformanceRecord(_environment(te.version, device, device_info, setup), tables, not_run,
                               time.perf_counter() - start)
    print(record.to_markdown())
    if args.out:
        written = record.write(args.out)
        print(f"{PREFIX}: wrote {', '.join(str(p) for p in written)}")
    return 0 if record.ok else 1


def _environment(te_version: str, device: torch.device, info: DeviceInfo, setup: Setup) -> dict[str, str]:
    cc = f"{info.capability[0]}.{info.capability[1]}"
    cuda = f", CUDA {torch.version.cuda}" if torch.version.cuda else ""
    return {
        "TransformerEngine": te_version,
        "GPU": f"{info.name} (compute capability {cc}), {device}",
        "torch": f"{torch.__version__}{cuda}",
        "refops": f"{refops.__version__} ({_commit()})",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "reference GEMM numerics": (f"refops.gemm_numerics({setup.gemm_numerics!r})" if setup.gemm_numerics
                                    else "refops' default (--gemm-numerics not given)"),
        "recipes (module and lifecycle tiers)": f"{TEST_RECIPES_NOTE}: " + "; ".join(
            f"{name} = {recipe_settings(name)}" for name in setup.recipes),
        "recipes (quantizer tier)": "; ".join(
            f"{name}: {what}" for name, (base, _, what) in QUANTIZER_RECIPES.items() if base in setup.recipes),
        "seed": str(setup.seed),
    }


def _commit() -> str:
    """The git commit of this refops checkout (``REFOPS_COMMIT`` wins: a copy whose ``.git`` is not the
    tree's own, as on a remote GPU machine, would name a wrong one), or "commit unknown" outside one."""
    if os.environ.get("REFOPS_COMMIT"):
        return f"commit {os.environ['REFOPS_COMMIT']}"
    root = pathlib.Path(__file__).resolve().parents[2]
    try:
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "commit unknown"
    return f"commit {done.stdout.strip()}" if done.returncode == 0 and done.stdout.strip() else "commit unknown"
