"""``refops check``: the differential matrix (:mod:`refops.testing.check_matrix`), with progress and a summary table.

Exit status: 0 when every case that ran passed, 1 otherwise.
"""

from __future__ import annotations

import argparse

from ..testing.check_matrix import CASES, DTYPES, check_target, run_check_matrix
from ..testing.recipes import RECIPE_NAMES, TEST_RECIPES_NOTE, recipe_settings
from .progress import Progress

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="run the differential matrix (fast path vs reference, or reference vs float64)")
    p.add_argument("--ops", nargs="+", choices=sorted(CASES), help="only these ops")
    p.add_argument("--recipes", nargs="+", choices=RECIPE_NAMES, help="only these recipes (plus high precision)")
    p.add_argument("--dtypes", nargs="+", choices=sorted(DTYPES), help="only these dtypes")
    p.add_argument("--reference-only", action="store_true", help="compare with float64 torch even with a GPU")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    target = check_target(reference_only=args.reference_only)
    if target.fastpath_unavailable:
        print(f"fast path unavailable ({target.fastpath_unavailable}); checking the reference against float64 torch")
    mode = "fast path vs reference" if target.fastpath else "reference vs float64 torch (quantize-dequantized inputs)"
    print(f"refops check: {mode} on {target.device}")
    ran_recipes = [r for r in RECIPE_NAMES if not args.recipes or r in args.recipes]
    if ran_recipes:
        print(f"recipes: {TEST_RECIPES_NOTE}:")
        for name in ran_recipes:
            print(f"  {name} = {recipe_settings(name)}")
    progress = Progress()
    results = run_check_matrix(target.device, fastpath=target.fastpath, ops=args.ops, recipes=args.recipes,
                               dtypes=args.dtypes, progress=progress)
    progress.close()
    ran = [r for r in results if not r.skipped]
    skipped = [r for r in results if r.skipped]
    print(f"{'op':<12}{'recipe':<22}{'dtype':<10}{'result':<8}{'seconds':>8}  {'worst comparison':<24}"
          "measured [criterion]")
    for r in ran:
        print(f"{r.op:<12}{r.recipe:<22}{r.dtype:<10}{'ok' if r.passed else 'FAIL':<8}{r.seconds:>8.2f}  "
              f"{r.worst:<24}{r.error}")
    for r in skipped:
        print(f"skipped: {r.op} {r.recipe} {r.dtype}: {r.skipped}")
    failed = [r for r in ran if not r.passed]
    print(f"{len(ran) - len(failed)}/{len(ran)} cases passed, {len(skipped)} skipped")
    return 1 if failed else 0
