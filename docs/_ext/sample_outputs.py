"""The sample outputs the pages show, produced by running the commands at build time (``refops_artifacts``).

A page shows a sample with ``{literalinclude}`` of ``_generated/sample-*.txt``, so what it shows is what the
command printed during this build: a changed column or message changes the page, and cannot go stale.
Each function returns the file's bytes; :data:`SAMPLES` lists them for ``refops_artifacts.ARTIFACTS``.

* ``sample-trace-construction.txt``, ``sample-trace-step.txt``: ``refops trace`` (getting-started), excerpts;
  ``...`` marks the lines left out;
* ``sample-check.txt``: ``refops check`` on two ops and one dtype, in full;
* ``sample-conformance-unavailable.txt``: what ``refops conformance`` says on a machine with neither a CUDA GPU
  nor TransformerEngine (both are hidden from it while it runs, so every build machine shows the same case).
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from typing import Callable
from unittest import mock

__all__ = ["SAMPLES", "CHECK_ARGS", "TRACE_ARGS", "run_cli"]

TRACE_ARGS = ["trace", "--steps", "1"]
CHECK_ARGS = ["check", "--ops", "linear", "mlp", "--dtypes", "bfloat16", "--reference-only"]


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    """``python -m refops ARGV`` in this process: its exit status, stdout and stderr."""
    from refops.__main__ import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@functools.lru_cache(maxsize=None)
def _trace_sections() -> dict[str, list[str]]:
    status, out, err = run_cli(TRACE_ARGS)
    if status != 0:
        raise RuntimeError(f"sample_outputs: refops {' '.join(TRACE_ARGS)} exited {status}:\n{out}{err}")
    sections: dict[str, list[str]] = {}
    for line in out.splitlines():
        if line.startswith("== "):
            current = sections.setdefault(line.split(" (")[0].removeprefix("== "), [])
        current.append(line)
    return sections


def _excerpt(lines: list[str], keep: Callable[[str], bool]) -> str:
    """The header and the event lines ``keep`` accepts, ``  ...`` for each run of lines left out."""
    shown, skipping = [lines[0]], False
    for line in lines[1:]:
        if keep(line):
            shown.append(line)
            skipping = False
        elif not skipping:
            shown.append("  ...")
            skipping = True
    return "\n".join(shown) + "\n"


def trace_construction() -> bytes:
    lines = _trace_sections()["construction"]
    return _excerpt(lines, lambda line: line in lines[1:6]).encode()


def trace_step() -> bytes:
    """The first training step: the first event of each kind, every materialization, and the last event."""
    lines = _trace_sections()["training step 1"]
    firsts = {}
    for line in lines[1:]:
        firsts.setdefault(line.split()[1], line)
    keep = set(firsts.values()) | {line for line in lines if " materialize " in line} | {lines[-1]}
    return _excerpt(lines, keep.__contains__).encode()


def check() -> bytes:
    status, out, err = run_cli(CHECK_ARGS)
    if status != 0:
        raise RuntimeError(f"sample_outputs: refops {' '.join(CHECK_ARGS)} exited {status}:\n{out}{err}")
    return (f"$ python -m refops {' '.join(CHECK_ARGS)}\n" + out).encode()


def conformance_unavailable() -> bytes:
    import importlib.util

    import torch

    with contextlib.ExitStack() as hidden:  # hide only what is there: what is missing gives its real message
        if torch.cuda.is_available():
            hidden.enter_context(mock.patch.object(torch.cuda, "is_available", lambda: False))
        if importlib.util.find_spec("transformer_engine") is not None:
            hidden.enter_context(mock.patch.dict(sys.modules, {"transformer_engine": None}))
        status, out, err = run_cli(["conformance"])
    if status != 2 or out:
        raise RuntimeError(f"sample_outputs: refops conformance without GPU and TE exited {status}:\n{out}{err}")
    return f"$ python -m refops conformance\n{err}(exit status {status})\n".encode()


#: File name -> function returning its bytes.
SAMPLES: dict[str, Callable[[], bytes]] = {
    "sample-trace-construction.txt": trace_construction,
    "sample-trace-step.txt": trace_step,
    "sample-check.txt": check,
    "sample-conformance-unavailable.txt": conformance_unavailable,
}
