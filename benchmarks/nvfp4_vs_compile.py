"""NVFP4 quantization on a GPU: refops's fast path against ``torch.compile`` of a plain-torch formulation.

    python benchmarks/nvfp4_vs_compile.py [--shape M K] [--json OUT.json]

The peer is what a user without refops would write and compile: the two-level NVFP4 formula (a global
fp32 scale from the tensor's amax, E4M3 scales of 1x16 blocks, E2M1 codes rounded to nearest-even by
seven comparisons, two codes packed per byte), compiled by Inductor into fused Triton kernels. Before
timing, the script asserts that both produce the same bytes (data, block scales, amax), row-wise only
and row-wise + column-wise (the column-wise copy is the row-wise quantization of the transpose). Times
are CUDA-event medians of back-to-back calls; the ratio is refops / peer (below 1: refops faster).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any, Callable, Optional

import torch

FLT_MAX = torch.finfo(torch.float32).max
#: Midpoints between consecutive E2M1 magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; a tie goes to the even code,
#: so the comparison is strict after an even code and inclusive after an odd one.
MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    code = torch.zeros_like(a, dtype=torch.uint8)
    for i, m in enumerate(MIDPOINTS):
        code = code + (a > m if i % 2 == 0 else a >= m).to(torch.uint8)
    return code + torch.signbit(v).to(torch.uint8) * 8


def nvfp4_rowwise(x: torch.Tensor, amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed codes ``(M, K/2)`` and E4M3 block-scale bytes ``(M, K/16)`` for the global ``amax``."""
    m, k = x.shape
    s_enc = torch.where(amax > 0, (448.0 * 6.0) / amax, torch.ones_like(amax)).clamp_max(FLT_MAX)
    s_dec = 1.0 / s_enc
    blocks = x.float().reshape(m, k // 16, 16)
    block_amax = blocks.abs().amax(dim=2, keepdim=True)
    s_b = (block_amax * (s_enc * (1.0 / 6.0))).clamp(max=448.0).to(torch.float8_e4m3fn)
    enc = (1.0 / (s_b.float() * s_dec)).clamp_max(FLT_MAX)
    codes = e2m1_codes(blocks * enc).reshape(m, k)
    return codes[:, 0::2] | (codes[:, 1::2] << 4), s_b.reshape(m, k // 16).view(torch.uint8)


def peer(x: torch.Tensor, columnwise: bool) -> tuple[torch.Tensor, ...]:
    amax = x.float().abs().amax().reshape(1)
    data, scale = nvfp4_rowwise(x, amax)
    if not columnwise:
        return data, scale, amax
    col_data, col_scale = nvfp4_rowwise(x.t(), amax)
    return data, scale, amax, col_data, col_scale


def refops_fastpath(columnwise: bool) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    from refops.quantization.nvfp4 import NVFP4Quantizer

    quantizer = NVFP4Quantizer(rowwise=True, columnwise=columnwise)

    def run(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q = quantizer.quantize(x)
        m, k = x.shape
        out = (q._rowwise_data.reshape(m, k // 2), q._rowwise_scale_inv[:m, : k // 16], q._amax_rowwise)
        if columnwise:
            out += (q._columnwise_data.reshape(k, m // 2), q._columnwise_scale_inv[:k, : m // 16])
        return out
    return run


def median_ms(fn: Callable[[], Any], reps: int = 50, warmup: int = 5) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=int, nargs=2, default=(16384, 8192))
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("nvfp4_vs_compile.py times GPU kernels; torch reports no GPU: nothing measured")
        return 0
    import refops

    refops.use_backend("fastpath")
    m, k = args.shape
    torch.manual_seed(0)
    rows = []
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(m, k, device="cuda", dtype=dtype) * 3
        for columnwise in (False, True):
            compiled = torch.compile(lambda t, c=columnwise: peer(t, c), fullgraph=True, dynamic=False)
            ours = refops_fastpath(columnwise)
            got, want = ours(x), compiled(x)
            names = ["data", "scale", "amax", "col data", "col scale"]
            bad = [n for n, a, b in zip(names, got, want) if not torch.equal(a.reshape(b.shape), b)]
            if bad:
                print(f"MISMATCH {dtype} columnwise={columnwise}: {bad}")
                return 1
            ms_refops = median_ms(lambda: ours(x))
            ms_peer = median_ms(lambda: compiled(x))
            gbytes = x.numel() * x.element_size() * 1e-9
            rows.append({"dtype": str(dtype).replace("torch.", ""), "orientations": "row+col" if columnwise else "row",
                         "refops_ms": ms_refops, "compiled_ms": ms_peer, "ratio": ms_refops / ms_peer,
                         "refops_input_GBps": gbytes / (ms_refops * 1e-3)})
    print(f"NVFP4 quantization of a {m}x{k} tensor on {torch.cuda.get_device_name()} (same bytes asserted)")
    print(f"{'dtype':<10}{'orientations':<14}{'refops ms':>11}{'compiled ms':>13}{'refops/compiled':>17}")
    for r in rows:
        print(f"{r['dtype']:<10}{r['orientations']:<14}{r['refops_ms']:>11.3f}{r['compiled_ms']:>13.3f}"
              f"{r['ratio']:>17.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": [m, k], "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
