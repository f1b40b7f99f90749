"""Build the variants of GPU run 21 (prepared 2026-11-30 after the session's device time was spent). Run from the
repository root.

_variants/rowptr: the tree with row_pointer.patch applied to fastpath/kernels/norm.cu. Each row's x, dy, dx (y in
    the forward kernels) and next-row pointers are formed once per row and passed through an opaque move
    (row_pointer), and the column bounds are compared in 32 bits. GPU run 20's SASS counts showed the compiler
    folding r * n into every pack's address as 64-bit arithmetic: about nine instructions a pack, with the bounds
    recomputed as 64-bit compares each row. Static SASS of the branch-free vector path (static_sass_counts.sh)
    (CUDA 13.0, sm_90): layer_norm_bwd 1584 -> 1488 instructions, rms_norm_bwd 1160 -> 1064, l2_norm_bwd
    1152 -> 1056, layer_norm_fwd 1600 -> 1520, rms_norm_fwd 1000 -> 880. Results cannot change: only addresses are
    formed differently.
_variants/rowptrc2: rowptr with lnc2_after_row_pointer.patch, run 17's lnc2 form of LayerNorm backward's dx,
    fma(-c2, x - mean, rstd * (g - mean_g)) with c2 = rstd * rstd * mean_gx once per row: two operations fewer per
    element (run 17: 2 % faster, norm tests pass). It leaves the reference's formula: take it only if it is what
    brings LayerNorm backward to 80 %, and then say so in norm.cu's header and docs/benchmarks.md.
"""
import pathlib
import shutil
import subprocess

ROOT = pathlib.Path(".").resolve()
dst = ROOT / "_variants" / "rowptr"
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(ROOT / "fastpath", dst / "fastpath", ignore=shutil.ignore_patterns("__pycache__"))
patch = ROOT / "benchmarks/results/h200-next-run21/row_pointer.patch"
subprocess.run(["patch", "-p1", "-d", str(dst), "-i", str(patch)], check=True)
print("built", dst)

c2 = ROOT / "_variants" / "rowptrc2"
shutil.rmtree(c2, ignore_errors=True)
shutil.copytree(dst, c2)
subprocess.run(["patch", "-p1", "-d", str(c2), "-i", str(patch.with_name("lnc2_after_row_pointer.patch"))], check=True)
print("built", c2)
