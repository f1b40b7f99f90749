"""The installed package runs on its own: the wheel, in a fresh virtual environment, outside the checkout.

``refops bench`` once ran ``../benchmarks/bench_fastpath.py`` by path, which an installed wheel does not have. Here
the wheel is built from a copy of the distribution's files, installed into a new virtual environment that reuses
this environment's torch and numpy (through a ``.pth`` file: ``--system-site-packages`` would reach the base
interpreter's packages, not those of a virtual environment such as CI's), and its ``refops`` command runs from
a directory that holds no checkout.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: What the wheel is built from (pyproject.toml's packages and its readme).
DISTRIBUTION = ("pyproject.toml", "README.md", "refops", "fastpath")


def _run(command: list, *, cwd: pathlib.Path, env: dict, timeout: int = 120) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


@pytest.mark.slow  # builds and installs a wheel: about 20 s
def test_the_installed_wheel_runs_bench_and_check_outside_the_checkout(tmp_path):
    pytest.importorskip("setuptools", reason="the wheel is built without network: needs setuptools here")
    import numpy
    import torch

    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    source = tmp_path / "source"
    source.mkdir()
    for name in DISTRIBUTION:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, source / name)
    wheels = tmp_path / "wheels"
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source],
         cwd=tmp_path, env=env, timeout=300)
    (wheel,) = wheels.glob("refops-*.whl")

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp_path, env=env)
    python = venv / ("Scripts" if os.name == "nt" else "bin") / "python"
    site_packages = pathlib.Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                      cwd=tmp_path, env=env).stdout.strip())
    reused = {str(pathlib.Path(m.__file__).resolve().parents[1]) for m in (torch, numpy)}
    (site_packages / "reused_from_the_test_environment.pth").write_text("\n".join(sorted(reused)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel],
         cwd=tmp_path, env=env, timeout=300)

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run([python, "-c", "import refops, fastpath.benchmark; print(refops.__file__); print(fastpath.__file__)"],
                 cwd=outside, env=env).stdout.split()
    assert all(pathlib.Path(p).resolve().is_relative_to(venv.resolve()) for p in where), where
    refops = python.parent / "refops"

    usage = _run([refops, "bench", "--help"], cwd=outside, env=env).stdout
    assert usage.startswith("usage: refops bench") and "refops bench -- --help" in usage
    options = _run([refops, "bench", "--", "--help"], cwd=outside, env=env).stdout
    assert options.startswith("usage: python -m fastpath.benchmark") and "--quick" in options
    if not torch.cuda.is_available():
        refused = subprocess.run([refops, "bench", "--", "--quick"], cwd=outside, env=env, capture_output=True,
                                 text=True, timeout=120)
        assert refused.returncode == 2 and "no CUDA GPU" in refused.stdout, refused.stdout + refused.stderr
    checked = _run([refops, "check", "--reference-only", "--ops", "gelu", "--dtypes", "bfloat16",
                    "--recipes", "mxfp8"], cwd=outside, env=env, timeout=300).stdout
    assert "2/2 cases passed, 0 skipped" in checked
    assert list(outside.iterdir()) == []  # nothing written where it ran
