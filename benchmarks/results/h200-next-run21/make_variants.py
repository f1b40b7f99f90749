"""Build the variant of GPU run 21 (prepared 2026-11-30 after the session's device time was spent). Run from the
repository root.

_variants/rowptr: the tree with row_pointer.patch applied to fastpath/kernels/norm.cu. Each row's x, dy, dx (y in
    the forward kernels) and next-row pointers are formed once per row and passed through an opaque move
    (row_pointer), and the column bounds are compared in 32 bits. GPU run 20's SASS counts showed the compiler
    folding r * n into every pack's address as 64-bit arithmetic: about nine instructions a pack, with the bounds
    recomputed as 64-bit compares each row. Static SASS of the branch-free vector path, counted with cuobjdump
    (CUDA 13.0, sm_90): layer_norm_bwd 1584 -> 1488 instructions, rms_norm_bwd 1160 -> 1064, l2_norm_bwd
    1152 -> 1056, layer_norm_fwd 1600 -> 1520, rms_norm_fwd 1000 -> 880. Results cannot change: only addresses are
    formed differently.
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
