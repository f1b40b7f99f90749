"""CI compile check: every ``fastpath/kernels/*.cu`` must compile for Hopper with nvcc.

``python -m fastpath.compile_check [--jobs N] [FILE ...]`` compiles each file with

    nvcc -arch=sm_90 -std=c++17 --fmad=false --ftz=false --prec-div=true --prec-sqrt=true -c <file> -o <tmp>.o

(the fast path's NVRTC options plus Hopper; activation.cu and activation_quantize.cu
run with --fmad=true, which changes code generation, not what compiles), prints one line per file and exits
nonzero if any file fails. Without nvcc (not on PATH, not under ``$CUDA_HOME/bin``)
it exits 0 saying why it skipped, unless the environment variable ``CI`` is set:
then a missing nvcc is a failure with a clear message.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

__all__ = ["KERNEL_DIR", "NVCC_FLAGS", "CompileResult", "find_nvcc", "kernel_files", "compile_file", "main"]

KERNEL_DIR = pathlib.Path(__file__).resolve().parent / "kernels"
NVCC_FLAGS = ("-arch=sm_90", "-std=c++17", "--fmad=false", "--ftz=false", "--prec-div=true", "--prec-sqrt=true")


@dataclasses.dataclass(frozen=True)
class CompileResult:
    """Outcome of compiling one file: ``ok``, the seconds it took and nvcc's messages."""

    path: pathlib.Path
    ok: bool
    seconds: float
    output: str

    @property
    def warnings(self) -> int:
        return sum("warning" in line.lower() for line in self.output.splitlines())

    def line(self) -> str:
        status = "ok" if self.ok else "FAILED"
        extra = f", {self.warnings} warning(s)" if self.warnings else ""
        return f"{status:6} {self.path.name} ({self.seconds:.1f} s{extra})"


def find_nvcc() -> Optional[str]:
    """Path of nvcc: on PATH, else ``$CUDA_HOME/bin/nvcc`` or ``$CUDA_PATH/bin/nvcc``, else None."""
    found = shutil.which("nvcc")
    if found:
        return found
    for var in ("CUDA_HOME", "CUDA_PATH"):
        root = os.environ.get(var)
        if root and (pathlib.Path(root) / "bin" / "nvcc").is_file():
            return str(pathlib.Path(root) / "bin" / "nvcc")
    return None


def kernel_files() -> list[pathlib.Path]:
    """Every CUDA source of the fast path, sorted."""
    return sorted(KERNEL_DIR.glob("*.cu"))


def compile_file(path: pathlib.Path, nvcc: str) -> CompileResult:
    """Compile one file to a temporary object file; ``ok`` is nvcc's exit status being 0."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [nvcc, *NVCC_FLAGS, "-c", str(path), "-o", str(pathlib.Path(tmp) / (path.stem + ".o"))]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    output = (proc.stdout + proc.stderr).strip()
    return CompileResult(pathlib.Path(path), proc.returncode == 0, time.perf_counter() - start, output)


def compile_all(paths: Sequence[pathlib.Path], nvcc: str, jobs: int) -> list[CompileResult]:
    """Compile ``paths`` with up to ``jobs`` nvcc processes at once, results in input order."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        return list(pool.map(lambda p: compile_file(p, nvcc), paths))


def missing_nvcc_message() -> str:
    return ("nvcc not found (not on PATH, not in $CUDA_HOME/bin or $CUDA_PATH/bin); install the CUDA "
            "toolkit (12.x or 13.x) to compile fastpath/kernels/*.cu")


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fastpath.compile_check", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=pathlib.Path, help="files to compile (default: every kernel)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel nvcc processes")
    args = parser.parse_args(argv)
    nvcc = find_nvcc()
    if nvcc is None:
        if os.environ.get("CI"):
            print(f"FAILED: {missing_nvcc_message()} (CI is set, so the compile check cannot be skipped)")
            return 1
        print(f"skipped: {missing_nvcc_message()} (set CI to make this an error)")
        return 0
    paths = args.files or kernel_files()
    if not paths:
        print(f"FAILED: no .cu files under {KERNEL_DIR}")
        return 1
    print(f"nvcc: {nvcc}; flags: {' '.join(NVCC_FLAGS)}")
    results = compile_all(paths, nvcc, args.jobs)
    for result in results:
        print(result.line())
        if not result.ok or result.warnings:
            print("\n".join("    " + line for line in result.output.splitlines()))
    failed = [r.path.name for r in results if not r.ok]
    summary = f"{len(results) - len(failed)}/{len(results)} compiled"
    print(summary + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
