"""``refops conformance``: every tier of the oracle against the TransformerEngine installed on this GPU.

The run is :func:`refops.testing.conformance.run_conformance`; this command parses its options, draws a
progress bar on stderr when it is a terminal, prints the record as Markdown and, with ``--out DIR``, writes
``DIR/conformance.md`` and ``DIR/conformance.json``.

Exit status: 0 when every row passes, 1 when a row fails, 2 when the run cannot start (no
TransformerEngine, no CUDA GPU, an option this refops cannot honour, an ``--out`` it cannot write: checked
before anything runs) or its record could not be written after all, with a one-line reason.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

import torch

from ..testing.conformance import (
    DTYPES,
    RECIPE_CHOICES,
    RECORD_FILES,
    TIERS,
    ConformanceUnavailable,
    DeviceInfo,
    plan_conformance,
)
from ..testing.transformer_engine import LIFECYCLE_OPS, PIPELINES
from .arguments import output_folder
from .progress import Progress

__all__ = ["add_parser", "run"]

PREFIX = "refops conformance"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "conformance",
        help="check the installed TransformerEngine against refops on this GPU, every tier of the oracle",
        description="Run the oracle's quantizer, module and lifecycle tiers with TransformerEngine as the "
                    "candidate, on this machine's CUDA GPU. Needs TransformerEngine "
                    "(pip install --no-build-isolation 'transformer_engine[pytorch]').",
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
    p.add_argument("--out", metavar="DIR", type=output_folder(*RECORD_FILES),
                   help="write conformance.md and conformance.json into DIR (made if needed)")
    p.add_argument("--seed", type=int, default=0, help="the seed of every input and initialization (default 0)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, *, device: Optional[torch.device] = None,
        device_info: Optional[DeviceInfo] = None) -> int:
    """Run the conformance; ``device`` and ``device_info`` replace the GPU's (tests run it on the CPU)."""
    try:
        plan = plan_conformance(tiers=args.tiers, recipes=args.recipes, dtypes=args.dtypes,
                                pipelines=args.pipelines, ops=args.ops, gemm_numerics=args.gemm_numerics,
                                seed=args.seed, device=device, device_info=device_info)
    except ConformanceUnavailable as error:
        for reason in error.reasons:
            print(f"{PREFIX}: {reason}", file=sys.stderr)
        return 2
    progress = Progress()
    record = plan.run(progress)
    progress.close()
    print(record.to_markdown())
    if args.out:
        try:  # --out was probed before the run; this catches what changed since (a full disk)
            written = record.write(args.out)
        except OSError as error:
            print(f"{PREFIX}: error: could not write the record into {args.out} ({error}); "
                  "its Markdown is printed above", file=sys.stderr)
            return 2
        print(f"{PREFIX}: wrote {', '.join(str(p) for p in written)}")
    return 0 if record.ok else 1
