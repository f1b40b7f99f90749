"""Build the variant of GPU run 28 (prepared 2026-11-30, after the session's device time was spent). Run from the
repository root.

_variants/rhtneg: nvfp4.cu's RHT butterflies take the random signs in their first stage (fwht_signed_stage1):
    each signed pair becomes b - a or (-a) - b, the negation an operand modifier, instead of a sign-bit flip (LOP3)
    per negative element before the stages. Each result is the same IEEE operation on the same values as before, so
    results are identical, zeros' signs included. Static SASS (CUDA 13.0, sm_90): nvfp4_rht_amax_bf16 2304 -> 2256
    instructions, nvfp4_quantize_rht_bf16 3504 -> 3472. Target: the RHT-amax pass 1, at 81 % of the copy in run 25
    (85 % is the floor); it executes about 11.5 instructions per element (run 21) at about 58 % of peak issue.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from build_variants import build  # noqa: E402

build("rhtneg", [HERE / "rht_signs.patch"])
