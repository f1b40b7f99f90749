"""Build the variants of GPU run 23 (run from the repository root; the patches are in this directory).

_variants/stg: the norm kernels' vector forms that keep a row in registers (every forward kernel; the backward
    kernels except layer_norm_bwd_wide) stage the next row in shared memory with cp.async (RowStage in norm.cu)
    instead of asking L2 for it: each thread copies exactly the 16-byte packs it will read, once it has used the
    values of the current row (after the forward's sums, after the backward's pass 1), and waits for its own copies
    at the next row's start; no barrier is needed. The row's loads at the start of each row then come from shared
    memory, not L2. Dynamic shared memory: 16 bytes per pack, tensor and thread (forward 16 KiB, backward 32 KiB for
    256 threads); the launcher raises the limit where it exceeds the default. The cp.async helpers move from
    nvfp4.cu to cp_async.cuh (nvfp4.cu's PTX is identical). Results cannot change: the same values reach the same
    arithmetic.
_variants/stgp: stg, keeping the tree's L2 prefetch of the next row as well, so that the staging copies hit L2.
"""
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(".").resolve()
HERE = ROOT / "benchmarks/results/h200-2026-11-30-run23"
for name, patches in (("stg", ["stg.patch"]), ("stgp", ["stg.patch", "stgp_after_stg.patch"])):
    dst = ROOT / "_variants" / name
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
    for patch in patches:
        subprocess.run(["patch", "-p1", "-d", str(dst), "-i", str(HERE / patch)], check=True)
    print("built", dst)
