"""Every fastpath/kernels/*.cu compiles for Hopper with nvcc (the CI compile check).

Runs on CPU-only machines too: only nvcc is needed. Without nvcc the tests fail
when the environment variable CI is set and skip (with the reason) otherwise.
Each kernel file is compiled once per session (``-c``, keeping the PTX of the same run), in the background
with the other compile checks, and cached by content (``_nvcc_builds.py``); each test reports one file.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest
from _nvcc_builds import Build

from fastpath import compile_check
from fastpath._cuda import kernel_source

FILES = compile_check.kernel_files()
REPO = pathlib.Path(__file__).resolve().parents[2]
HEADER_USERS = [p for p in FILES if '#include "' in p.read_text()]


def object_build(path: pathlib.Path) -> Build:
    """The CI compile check's nvcc run of one kernel file: the fast path's flags plus Hopper, in place."""
    return Build(path.name, compile_check.NVCC_FLAGS, "object", source=path)


def inlined_ptx_build(path: pathlib.Path) -> Build:
    """The source NVRTC gets (headers inlined), to PTX with the same flags."""
    return Build(path.name, compile_check.NVCC_FLAGS, "ptx", text=kernel_source(path.name))


def test_kernel_sources_exist():
    names = {p.name for p in FILES}
    assert {"activation.cu", "norm.cu"} <= names, f"kernel sources found: {sorted(names)}"


@pytest.mark.parametrize(
    "path", [pytest.param(p, marks=pytest.mark.compile(object_build(p)), id=p.name) for p in FILES])
def test_compiles_for_sm90(path, nvcc_builds):
    result = nvcc_builds.result(object_build(path))
    assert result.ok, f"nvcc {' '.join(compile_check.NVCC_FLAGS)} -c {path.name} failed:\n{result.output}"


def test_cli_without_nvcc_skips_or_fails_in_ci(tmp_path):
    """The module's own CLI: with no nvcc reachable it exits 0 (skipped) or 1 under CI, saying why."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = str(tmp_path)  # an empty directory: no nvcc
    cmd = [sys.executable, "-m", "fastpath.compile_check"]
    skipped = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    assert skipped.returncode == 0, skipped.stdout + skipped.stderr
    assert "skipped" in skipped.stdout and "nvcc not found" in skipped.stdout
    failed = subprocess.run(cmd, cwd=REPO, env={**env, "CI": "true"}, capture_output=True, text=True)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "FAILED" in failed.stdout and "CI is set" in failed.stdout


def test_cli_reports_a_broken_file(tmp_path, nvcc):
    """A file that does not compile makes the CLI print FAILED for it and exit nonzero."""
    broken = tmp_path / "broken.cu"
    broken.write_text('extern "C" __global__ void k(float* p) { p[0] = undefined_name; }\n')
    proc = subprocess.run([sys.executable, "-m", "fastpath.compile_check", str(broken)], cwd=REPO,
                          capture_output=True, text=True)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED broken.cu" in proc.stdout and "undefined_name" in proc.stdout


def test_shared_headers_are_inlined_for_nvrtc():
    """Kernel files share headers (ieee_f32.cuh, fp8_elements.cuh, vector_io.cuh, ...); the source handed to
    NVRTC has each of them inlined."""
    assert {"cast_fp8.cu", "fp8_block.cu", "mxfp8.cu", "nvfp4.cu", "activation.cu", "norm.cu"} <= {
        p.name for p in HEADER_USERS}
    for path in HEADER_USERS:
        source = kernel_source(path.name)
        assert '#include "' not in source, f"{path.name}: a local include is left for NVRTC"
        for header in re.findall(r'^#include "(\w+\.cuh)"', path.read_text(), re.MULTILINE):
            code = [line for line in (path.parent / header).read_text().splitlines()
                    if line.strip() and not line.startswith("//") and line.strip() != "#pragma once"]
            assert all(line in source for line in code), f"{path.name}: {header} was not inlined"


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.compile(object_build(p), inlined_ptx_build(p)), id=p.name)
    for p in HEADER_USERS])
def test_inlined_source_compiles_to_the_same_ptx(path, nvcc_builds):
    """What NVRTC compiles (headers inlined) is the code nvcc builds from the file and its headers."""
    from_file = nvcc_builds.result(object_build(path))
    inlined = nvcc_builds.result(inlined_ptx_build(path))
    assert from_file.ok and inlined.ok, from_file.output + inlined.output
    assert from_file.ptx and inlined.ptx, f"{path.name}: nvcc wrote no PTX"
    assert from_file.ptx == inlined.ptx, f"{path.name}: inlining its headers changed the generated code"


def test_a_line_announces_the_compile_checks_before_they_start(tmp_path):
    """Issue #37: the compile checks ran about 1.5 minutes at the end of the suite without a word."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "CUDA_HOME", "CUDA_PATH")}
    env["PATH"] = str(tmp_path)  # no nvcc: the checks skip, and the line comes before them all the same
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/fastpath/test_compile.py",
           "-k", "test_kernel_sources_exist or test_compiles_for_sm90"]
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    announced = [i for i, line in enumerate(lines) if line.startswith("refops: ")]
    assert len(announced) == 1, done.stdout
    assert lines[announced[0]].startswith(f"refops: {len(FILES)} nvcc compile checks of the CUDA kernels run now")
    assert lines[announced[0] - 1] == ".", "the line comes after the test before the compile checks, on its own line"
