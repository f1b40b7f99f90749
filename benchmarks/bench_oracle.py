"""The module oracle's budget: ``compare_modules`` with its defaults (every scenario, the metamorphic checks) on a
Linear-GELU-Linear (64-256-64, batch 32), refops against itself, under each recipe; the budget is 3 s each on a CPU.

    python3 benchmarks/bench_oracle.py [--out FILE.md] [--repeat N] [--threads T]

Prints (and writes) one row per recipe: the median wall time of N calls, the process's CPU time of the same call
(every thread's; on a machine other jobs keep busy, the wall time is inflated and the CPU time much less so), and
the number of comparisons made.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

import refops as te
from refops.testing import RECIPE_NAMES, compare_modules, make_recipe

BUDGET_S = 3.0


def _mlp(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    return te.ops.Sequential(te.ops.Linear(64, 256, dtype=dtype), te.ops.GELU(), te.ops.Linear(256, 64, dtype=dtype))


def measure(recipe_name: str | None, repeat: int) -> tuple[float, float, int, bool]:
    """(median wall seconds, median CPU seconds, comparisons, ok) of ``repeat`` default calls."""
    recipe = make_recipe(recipe_name) if recipe_name else None
    dtype = torch.bfloat16 if recipe is not None else torch.float32
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1)).to(dtype)
    times, cpu_times, report = [], [], None
    for _ in range(repeat):
        candidate, reference = _mlp(dtype), _mlp(dtype)
        start, cpu_start = time.perf_counter(), time.process_time()
        report = compare_modules(candidate, reference, (x,), recipe=recipe)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return statistics.median(times), statistics.median(cpu_times), len(report.comparisons), report.ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the table to this markdown file")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch's intra-op threads (default: torch's own choice)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lines = [f"compare_modules defaults, Linear-GELU-Linear 64-256-64, batch 32, torch {torch.__version__}, "
             f"{torch.get_num_threads()} CPU threads, median of {args.repeat}; budget {BUDGET_S:g} s",
             "", "| recipe | dtype | wall seconds | CPU seconds | comparisons | report ok | within budget |",
             "|---|---|---|---|---|---|---|"]
    for name in [None, *RECIPE_NAMES]:
        seconds, cpu_seconds, count, ok = measure(name, args.repeat)
        dtype = "bfloat16" if name else "float32"
        lines.append(f"| {name or 'none'} | {dtype} | {seconds:.2f} | {cpu_seconds:.2f} | {count} | {ok} "
                     f"| {seconds <= BUDGET_S} |")
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
