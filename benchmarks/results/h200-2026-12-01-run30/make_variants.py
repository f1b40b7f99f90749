"""Build the variants of GPU run 30 (prepared 2026-12-01). Run from the repository root.

Both target LayerNorm backward (layer_norm_bwd, 76-77 % of the copy; the floor is 80 %, 0.241 ms).

_variants/vst: each thread's weight- and bias-gradient partial rows are written with 16-byte stores instead of one
    4-byte store per float (`partial_stores.patch`). Run 29's Nsight Compute profile flagged those stores: 3.78 M
    excess L2 sectors (8 % of the kernel's sectors), 32 sectors per warp store for 4 useful ones. Same values, same
    places.
_variants/stage: vst, and pass 1 keeps each pack's g = dy * gamma and xhat in shared memory, where pass 2 reads them
    back instead of unpacking x, dy and gamma again and recomputing both (`stage_g_xhat.patch`). Pass 2 computes
    rstd * ((g - mean_g) - xhat * mean_gx) on the same fp32 values in the same order, so dx is bit-identical. The
    kernel's bias-gradient buffer moves with them into 96 KiB of dynamic shared memory (bf16/fp16; 48 KiB fp32), which
    the launcher opts in to (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES). Static SASS (CUDA 13.0, sm_90) of
    layer_norm_bwd_bf16: FADD 1350 -> 1031, FMUL 958 -> 559, LDG 118 -> 71, LDS 315 -> 411, STS 76 -> 188; 128
    registers, 8 bytes spilled (none before). Run 18 showed LayerNorm and RMSNorm backward with durations in the ratio
    of their instruction counts.
"""
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from build_variants import build  # noqa: E402

build("vst", [HERE / "partial_stores.patch"])
build("stage", [HERE / "stage_g_xhat.patch"])
