"""The command line of ``bench_vs_te.py``: options, the plan, the budget, and the loop that writes the record after
every row."""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time
from typing import Any, Optional, Sequence

from . import budget as budgets
from .memory import GIB, step_memory_bytes
from .records import _fmt, compare_table, write_records
from .rows import ROWS, STEP_SIZES, Item, Sizes, make_plan, select_modes, select_rows, select_sizes

DESCRIPTION = "TransformerEngine and refops's fast path side by side on one GPU: same inputs, same work, one run."
DEFAULT_BUDGET_S = 300.0
#: The budget counts from here: bench_vs_te.py imports this module before torch, refops or TE.
STARTED = time.monotonic()


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=DESCRIPTION)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path("vs_te_out"), help="output directory")
    parser.add_argument("--rows", default="", help="comma-separated row keys or substrings (default: all): "
                        + ", ".join(r.key for r in ROWS))
    parser.add_argument("--sizes", default=None,
                        help="the step rows' sizes, comma-separated, in the order to run them (default: all = "
                             + ",".join(STEP_SIZES) + "; 'large' is hidden 8192 / ffn 32768 at 8192 tokens)")
    parser.add_argument("--modes", default="", help="the step rows' modes: eager, graphed (default: both)")
    parser.add_argument("--reps", type=int, default=20, help="timed calls per side and mode (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (default 3)")
    parser.add_argument("--size", type=int, default=Sizes.size, help="the quantize rows' tensor is SIZE x SIZE")
    parser.add_argument("--tokens", type=int, default=None, help="one step size instead of --sizes: tokens "
                        "(with --hidden, --ffn; defaults 8192, 4096, 16384)")
    parser.add_argument("--hidden", type=int, default=None)
    parser.add_argument("--ffn", type=int, default=None)
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help=f"seconds for the whole run (default {DEFAULT_BUDGET_S:.0f}; 0: no limit): a row starts "
                             "only if its expected time fits, the rest are recorded as not run")
    parser.add_argument("--no-kernels", dest="kernels", action="store_false",
                        help="skip the torch.profiler pass (kernel lists and host syncs per call)")
    parser.add_argument("--profile", action="store_true", help="also write a cProfile of refops's host time per row")
    parser.add_argument("--host-profile", action="store_true",
                        help="step rows: host ms per call of both sides (forward and backward apart, each call on "
                             "an idle GPU) and a CPU-only torch.profiler table by op (host_profile/)")
    parser.add_argument("--te-block-graphs", action="store_true",
                        help="capture TE's te.ops under Float8BlockScaling too (TE's own tests skip it)")
    parser.add_argument("--plan", action="store_true",
                        help="print the items with their expected seconds and memory, and exit (no GPU needed)")
    parser.add_argument("--compare", nargs=2, type=pathlib.Path, metavar=("BEFORE_JSON", "AFTER_JSON"),
                        help="print two records side by side and exit (no GPU needed)")
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0:
        parser.error("--reps must be >= 1 and --warmup >= 0")
    if args.budget_s < 0:
        parser.error("--budget-s must be >= 0 (0: no limit)")
    custom = (args.tokens, args.hidden, args.ffn)
    if any(v is not None for v in custom):
        if args.sizes is not None:
            parser.error("give --sizes or --tokens/--hidden/--ffn, not both")
        base = Sizes()
        args.step_sizes = [("custom", Sizes(args.size, args.tokens or base.tokens, args.hidden or base.hidden,
                                            args.ffn or base.ffn))]
    else:
        try:
            args.step_sizes = select_sizes(args.sizes)
        except ValueError as exc:
            parser.error(str(exc))
    try:
        args.step_modes = select_modes(args.modes)
    except ValueError as exc:
        parser.error(str(exc))
    return args


def build_plan(args: argparse.Namespace) -> list[Item]:
    return make_plan(select_rows(args.rows), args.step_sizes, args.step_modes, quantize_size=args.size)


def _options(args: argparse.Namespace) -> dict[str, Any]:
    return {"reps": args.reps, "warmup": args.warmup, "kernels": args.kernels, "host_profile": args.host_profile}


def plan_text(plan: Sequence[Item], args: argparse.Namespace) -> str:
    """The plan, one item a line: its id, expected seconds and (steps) memory; then the total."""
    lines = [f"{'item':<34} {'expected s':>10} {'GiB':>6}  work"]
    for item in plan:
        gib = "" if item.row.kind == "quantize" else \
            f"{step_memory_bytes(item.sizes, item.mode == 'graphed') / GIB:.1f}"
        lines.append(f"{item.id:<34} {budgets.estimate_s(item, **_options(args)):>10.1f} {gib:>6}  {item.work}")
    total = budgets.plan_seconds(list(plan), **_options(args))
    lines.append(f"{len(plan)} items, about {total:.0f} s with start-up"
                 + (f"; budget {args.budget_s:.0f} s" if args.budget_s else "; no budget"))
    return "\n".join(lines)


def _line(item: Item, record: dict[str, Any], seconds: float) -> str:
    return (f"{item.id:<34} baseline {_fmt(record['te_ms'])} ms  refops {_fmt(record['refops_ms'])} ms  "
            f"ratio {_fmt(record['ratio'], 2)}  device {_fmt(record.get('te_device_ms'))} / "
            f"{_fmt(record.get('refops_device_ms'))} ms  host {_fmt(record.get('te_host_ms'))} / "
            f"{_fmt(record.get('refops_host_ms'))} ms  ({seconds:.0f} s)"
            + (f"  [{record['skipped']}]" if record.get("skipped") else "")
            + (f"  [{record['te_skipped']}]" if record.get("te_skipped") else "")
            + (f"  [refops: {record['refops_error']}]" if record.get("refops_error") else ""))


def run_plan(plan: Sequence[Item], args: argparse.Namespace, meta: dict[str, Any], budget: budgets.Budget,
             measure: Any) -> list[dict[str, Any]]:
    """Measure each item that fits in the budget (``measure(item) -> record``), writing the records after every
    row; the items that do not fit go to ``meta["not_run"]``."""
    records: list[dict[str, Any]] = []
    meta["not_run"] = []
    options = _options(args)
    for item in plan:
        kind, estimate = budgets.kind_of(item), budgets.estimate_s(item, **options)
        if not budget.fits(kind, estimate):
            meta["not_run"].append({"id": item.id, "work": item.work, "reason": budget.reason(kind, estimate)})
            meta["stopped"] = "the time budget ran out"
            print(f"{item.id:<34} not run: {budget.reason(kind, estimate)}", flush=True)
        else:
            start = budget.elapsed()
            record = measure(item)
            seconds = budget.elapsed() - start
            budget.observe(kind, estimate, seconds)
            record["row_s"] = round(seconds, 1)
            records.append(record)
            print(_line(item, record, seconds), flush=True)
        meta["elapsed_s"] = budget.elapsed()
        write_records(args.out, records, meta)  # after every row: a run cut short keeps what it measured
    return records


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    budget = budgets.Budget(args.budget_s or None, start=STARTED if argv is None else None)
    if args.compare:
        before, after = (json.loads(p.read_text()) for p in args.compare)
        print(compare_table(before, after), end="")
        return 0
    try:
        plan = build_plan(args)
    except ValueError as exc:
        print(exc)
        return 2
    if args.plan:
        print(plan_text(plan, args))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("bench_vs_te.py times GPU work; torch reports no CUDA device: nothing measured")
        return 0
    import fastpath

    reason = fastpath.unavailable_reason()
    if reason:
        print(f"bench_vs_te.py needs the fast path: {reason}; nothing measured")
        return 0
    from .runner import run_item, run_meta
    from .sides import load_refops_fastpath, load_te

    load_refops_fastpath()
    te, te_reason = load_te()
    device = torch.device("cuda", torch.cuda.current_device())
    meta = run_meta(args, te, te_reason)
    print(f"refops from {meta['refops']}; TransformerEngine: {meta['te'] or te_reason}; {meta['device']}; "
          f"{len(plan)} items, budget {args.budget_s or 'none'} s", flush=True)
    run_plan(plan, args, meta, budget, lambda item: run_item(item, te, te_reason, args, device))
    print(f"wrote {args.out / 'vs_te.json'} and {args.out / 'vs_te.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
