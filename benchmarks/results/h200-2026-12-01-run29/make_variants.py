"""Build the variants of GPU run 29 (prepared 2026-11-30 as "run 28", run 2026-12-01). Run from the
repository root.

_variants/rhtneg: nvfp4.cu's RHT butterflies take the random signs in their first stage (fwht_signed_stage1):
    each signed pair becomes b - a or (-a) - b, the negation an operand modifier, instead of a sign-bit flip (LOP3)
    per negative element before the stages. Each result is the same IEEE operation on the same values as before, so
    results are identical, zeros' signs included. Static SASS (CUDA 13.0, sm_90): nvfp4_rht_amax_bf16 2304 -> 2256
    instructions, nvfp4_quantize_rht_bf16 3504 -> 3472. Target: the RHT-amax pass 1, at 81 % of the copy in run 25
    (85 % is the floor); it executes about 11.5 instructions per element (run 21) at about 58 % of peak issue.
_variants/colsum: one column-sum kernel body (kernels/column_sums.cuh) serves norm.cu's wgrad_finalize and
    activation.cu's dbias_finalize, which were two copies of the same loop. Each thread now sums 4 (or 2) adjacent
    columns with 16- (8-) byte loads, four rows of each array in flight, in the same order as before: stripe t adds
    rows t, t + 16, ... from +0, then the stripes are added in order. The results are bit-identical. The launcher
    picks 4 columns a thread where the width allows it and the blocks still cover every SM
    (_cuda.column_sums_shape). Run 18: wgrad_finalize took 8.7 us of LayerNorm backward's time at 47 % of DRAM
    bandwidth; reading its 17 MB at the copy's rate takes about 4 us. LayerNorm backward needs 4 % (10 us) more for its
    floor.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from build_variants import build  # noqa: E402

build("rhtneg", [HERE / "rht_signs.patch"])
build("colsum", [HERE / "column_sums.patch"])
