"""GPU memory of a training-step row: an upper estimate, so that a size is chosen (and a row skipped) before it OOMs.

The step is ``Linear(h, f) + bias -> GELU -> Linear(f, h) + bias`` on ``t`` tokens with bf16 parameters. A row keeps
both sides alive at once (TE's model and refops's, the same ``x`` and ``dy``), so the estimate is twice one side
plus what they share. Bytes per side, upper bounds (an FP8 recipe; bf16 needs less):

* weights, ``h f`` elements each of 2 linears: the bf16 parameter (2 B), its bf16 grad (2 B), its FP8 copies
  row- and column-wise (2 x 1 B), and an fp32 wgrad GEMM output before it is cast (4 B, one linear at a time, so
  half of it): ``2 x (2 + 2 + 2 + 2) = 16 h f``;
* activations, ``t f`` elements: saved for backward, the pre-GELU bf16 input of GELU (2 B) and GELU's output
  quantized both ways (2 B, or its bf16 value: 2 B); then the larger of the forward's fp32 GEMM output (4 B, the
  fused Linear+Bias asks for fp32 and rounds once) and the backward's dGELU input, output and their FP8 copies
  (2 + 2 + 2 B): ``2 + 2 + 6 = 10 t f``, and 2 more for the allocator's rounding of these large blocks: ``12 t f``;
* ``t h`` elements: the FP8 copies of ``x`` and ``dy`` (2 x 2 B), ``y`` (2 B), the dgrad GEMM's fp32 output (4 B):
  ``10 t h``;
* cuBLAS / cuBLASLt workspaces: 1 GiB.

Shared: ``x``, ``dy``, ``x.grad`` and the clones the SQNR check keeps (``6 x 2 t h``), and the CUDA context and
the caching allocator's slack, 2 GiB. A graphed row holds each side's activations twice: in the graph's private
pool and in the blocks its eager warm-up iterations left cached. The total is then multiplied by 1.2
(fragmentation).

For hidden 4096 / ffn 16384 this gives 9.5 GiB (2048 tokens, graphed) to 44 GiB (32768 tokens, graphed); for
hidden 8192 / ffn 32768, 33 GiB at 8192 tokens graphed (24 GiB eager), 51 GiB at 16384 and 88 GiB at 32768 tokens,
more than an H100's 79 GiB. The larger model shape runs at 8192 tokens (``vs_te.rows.STEP_SIZES["large"]``):
more than half of an 80 GB H100 to spare against an estimate that is already an upper bound, and a step of 4x the
FLOP of the 8192-token rows (16384 tokens would fit with less margin, at twice the time).
"""

from __future__ import annotations

from typing import Optional

from .rows import Sizes

GIB = 1 << 30
#: An H100 80GB HBM3's memory as torch reports it (``torch.cuda.mem_get_info()[1]``: 79.1 GiB).
H100_BYTES = int(79.1 * GIB)
WORKSPACE_BYTES = GIB
SHARED_OVERHEAD_BYTES = 2 * GIB
FRAGMENTATION = 1.2


def side_bytes(sizes: Sizes, graphed: bool = False) -> int:
    """One side's bytes of a step at ``sizes`` (the terms of the module docstring)."""
    t, h, f = sizes.tokens, sizes.hidden, sizes.ffn
    activations = 12 * t * f + 10 * t * h
    return 16 * h * f + activations * (2 if graphed else 1) + WORKSPACE_BYTES


def step_memory_bytes(sizes: Sizes, graphed: bool = False, sides: int = 2) -> int:
    """Upper estimate of the GPU bytes a step row needs with ``sides`` sides alive (2: TE and refops)."""
    shared = 12 * sizes.tokens * sizes.hidden + SHARED_OVERHEAD_BYTES
    return int(FRAGMENTATION * (sides * side_bytes(sizes, graphed) + shared))


def too_big(sizes: Sizes, graphed: bool, free_bytes: Optional[int]) -> Optional[str]:
    """Why a step row at ``sizes`` would not fit in ``free_bytes`` (None when it fits or the free memory is unknown)."""
    need = step_memory_bytes(sizes, graphed)
    if free_bytes is None or need <= free_bytes:
        return None
    return (f"needs about {need / GIB:.1f} GiB (vs_te.memory.step_memory_bytes), {free_bytes / GIB:.1f} GiB free "
            "on the GPU: not run")
