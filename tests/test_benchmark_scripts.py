"""The GPU-only scripts under ``benchmarks/`` say why they measure nothing on a machine without a GPU.

A benchmark or diagnostic that cannot run exits with a clear message instead of a traceback. The two
measuring scripts exit 0 (nothing to measure is not an error in a CPU job). The profiling driver exits 1,
because a profiler run that profiled nothing failed.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU these scripts measure for minutes")


@pytest.mark.parametrize(
    ("script", "args", "returncode", "message"),
    [
        ("diag_access_patterns.py", [], 0, "no CUDA device: nothing to measure"),
        ("bench_fastpath.py", ["--quick", "--parts", "kernels"], 0, "nothing measured"),
        ("profile_cases.py", ["amax"], 1, "needs a GPU with CuPy"),
    ],
)
def test_script_without_a_gpu_says_why(script, args, returncode, message, tmp_path):
    if script == "bench_fastpath.py":
        args = [*args, "--out", str(tmp_path)]
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == returncode, done.stdout + done.stderr
    assert message in done.stdout, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
