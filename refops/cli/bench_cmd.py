"""``refops bench``: the fast path's benchmark (GPU only; a clear message otherwise).

The benchmark is the fast path's own program, ``python -m fastpath.benchmark``, run here in a subprocess of
this interpreter: ``refops`` never imports ``fastpath`` (the kernel registry finds it through its entry point),
and the benchmark ships in the wheel, so the command works from an installed package as from a checkout.
Options after ``--`` go to the benchmark (``refops bench -- --help`` lists them).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import pathlib
import subprocess
import sys

import torch

from ..kernels.registry import get_backend

__all__ = ["add_parser", "unavailable_reason", "benchmark_command", "BENCHMARK_MODULE"]

#: The module ``refops bench`` runs (``python -m``).
BENCHMARK_MODULE = "fastpath.benchmark"
_PACKAGE = BENCHMARK_MODULE.split(".")[0]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="run the fast-path benchmarks (needs a CUDA GPU and CuPy)",
                       description=f"Run the fast path's benchmark (python -m {BENCHMARK_MODULE}) on this GPU.",
                       epilog="Arguments after -- go to the benchmark: 'refops bench -- --help' lists them.")
    p.add_argument("script_args", nargs="*",
                   help=f"arguments for python -m {BENCHMARK_MODULE} (e.g. --quick, --out DIR)")
    p.set_defaults(func=run)


def unavailable_reason() -> str:
    """Why the benchmarks cannot run here ("" when they can)."""
    if not torch.cuda.is_available():
        return "no CUDA GPU is visible to torch; the benchmarks measure GPU kernels"
    try:
        get_backend("fastpath")
    except (RuntimeError, ValueError) as exc:
        return f"the fast path is unavailable: {exc}"
    return ""


def benchmark_command(script_args: list[str]) -> list[str]:
    """The benchmark's command line: this interpreter, ``-m fastpath.benchmark`` and ``script_args``."""
    return [sys.executable, "-m", BENCHMARK_MODULE, *script_args]


def _environment() -> dict[str, str]:
    """This process's environment, with the directory of the ``fastpath`` this process finds first on the
    child's path: the child's own first entry is its working directory, which may hold another tree."""
    env = dict(os.environ)
    spec = importlib.util.find_spec(_PACKAGE)  # finds, does not import
    if spec is not None and spec.origin:
        root = str(pathlib.Path(spec.origin).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(args: argparse.Namespace) -> int:
    # The benchmark's own help needs no GPU: only the package.
    asks_for_help = any(a in ("-h", "--help") for a in args.script_args)
    if asks_for_help and importlib.util.find_spec(_PACKAGE) is None:
        reason = f"the fast path ({_PACKAGE}) is not installed alongside refops"
    else:
        reason = "" if asks_for_help else unavailable_reason()
    if reason:
        print(f"refops bench: {reason}")
        return 2
    sys.stdout.flush()  # what this process printed comes before the benchmark's output
    return subprocess.run(benchmark_command(list(args.script_args)), env=_environment()).returncode
