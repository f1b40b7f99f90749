"""Build the variants of GPU run 31 (prepared 2026-12-01). Run from the repository root.

Both target NVFP4 pass 1 with the column-wise RHT amax (nvfp4_rht_amax_bf16: 0.076-0.077 ms in run 29, 84 % of the
copy; the floor, 85 %, is 0.0753 ms).

_variants/rhtwave: the kernel's grid is one wave of resident blocks (_cuda.resident_blocks) instead of 8 blocks per
    SM. It uses 80 registers a thread, so 3 of its 256-thread blocks fit on an SM: 8 per SM ran as 2.67 waves of
    equal blocks, the last a third empty (`rht_amax_wave.patch`).
_variants/rhtraw: rhtwave, and the exact chunks' magnitudes are maximized before the bf16 scaling, which is then
    applied once per thread (`rht_amax_wave_unscaled_max.patch`): bf16(fma(m, 0.25, +0)) is non-decreasing in m, so
    the maximum of the scaled values is the scaled maximum. Static SASS of the kernel 2256 -> 2232 instructions.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from build_variants import build  # noqa: E402

build("rhtwave", [HERE / "rht_amax_wave.patch"])
build("rhtraw", [HERE / "rht_amax_wave_unscaled_max.patch"])
