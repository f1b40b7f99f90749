"""``refops bench``: the fast-path benchmarks (GPU only; a clear message otherwise)."""

from __future__ import annotations

import argparse
import pathlib
import runpy
import sys

import torch

from ..kernels.registry import get_backend

__all__ = ["add_parser"]

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "bench_fastpath.py"


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run the fast-path benchmarks (needs a CUDA GPU and CuPy)")
    p.add_argument("script_args", nargs="*", help="arguments for benchmarks/bench_fastpath.py (e.g. --quick)")
    p.set_defaults(func=run)


def unavailable_reason() -> str:
    """Why the benchmarks cannot run here ("" when they can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch; the benchmarks measure GPU kernels"
    try:
        get_backend("fastpath")
    except (RuntimeError, ValueError) as exc:
        return f"the fast path is unavailable: {exc}"
    if not SCRIPT.exists():
        return f"{SCRIPT} is missing: run the benchmarks from a source checkout"
    return ""


def run(args: argparse.Namespace) -> int:
    reason = unavailable_reason()
    if reason:
        print(f"refops bench: {reason}")
        return 2
    sys.argv = [str(SCRIPT), *args.script_args]
    runpy.run_path(str(SCRIPT), run_name="__main__")
    return 0
