"""CPU speed of refops's reference quantizers against the peers a user would otherwise call.

Usage: ``python benchmarks/bench_reference.py [--quick] [--size N] [--reps R] [--threads T]``

Every recipe is quantized row-wise by refops's quantizer (``Quantizer.quantize``, what test suites
call) and by its peer (``peers.py``: a plain-torch formulation of TE's published algorithm, or
torchao's ``to_mx`` with RCEIL when torchao is installed) on the *same* tensor in this process. Before
anything is timed the script asserts that both produce byte-identical data and scales. Timing: one
warm-up each, then ``reps`` rounds of refops, peer, refops, peer, ... (interleaved, so a machine busy
for a moment slows both) and the median of each. Prints ``recipe | refops ms | peer ms | ratio`` with
the target ratio refops/peer <= 1.0.

``--quick`` (tiny tensors, one repeat) checks that the script and the byte-identity assertions work.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
from typing import Any, Callable

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import peers  # noqa: E402

from refops.quantization import (  # noqa: E402
    DType,
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)

TARGET = 1.0


def _refops_per_tensor(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, rowwise=True, columnwise=False).quantize(x)
    return q._data, q._scale_inv


def _refops_block(block_scaling_dim: int) -> Callable[[torch.Tensor], tuple[torch.Tensor, ...]]:
    def run(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        quantizer = Float8BlockQuantizer(
            DType.kFloat8E4M3, rowwise=True, columnwise=False, block_scaling_dim=block_scaling_dim
        )
        q = quantizer.quantize(x)
        m, k = x.shape
        rows = m if block_scaling_dim == 1 else m // 128
        scale = q._rowwise_scale_inv
        # 1D scales are stored [k/128, m] (GEMM-ready); 2D ones [m/128, k/128].
        valid = scale[: k // 128, :m].t() if block_scaling_dim == 1 else scale[:rows, : k // 128]
        return q._rowwise_data, valid
    return run


def _refops_mxfp8(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q = MXFP8Quantizer(DType.kFloat8E4M3, rowwise=True, columnwise=False).quantize(x)
    m, k = x.shape
    return q._rowwise_data, q._rowwise_scale_inv[:m, : k // 32]


def _refops_nvfp4(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    q = NVFP4Quantizer(rowwise=True, columnwise=False).quantize(x)
    m, k = x.shape
    return q._rowwise_data, q._rowwise_scale_inv[:m, : k // 16], q._amax_rowwise


def _cases(size: int) -> list[tuple[str, torch.dtype, Callable, Callable]]:
    """``(recipe, input dtype, refops fn, peer fn)``."""
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        cases += [
            ("per-tensor FP8 vs plain torch", dtype, _refops_per_tensor, peers.per_tensor_fp8),
            ("block FP8 1x128 vs TE-style torch", dtype, _refops_block(1), lambda x: peers.block_fp8(x, 1)),
            ("block FP8 128x128 vs TE-style torch", dtype, _refops_block(2), lambda x: peers.block_fp8(x, 128)),
            ("MXFP8 vs plain torch", dtype, _refops_mxfp8, peers.mxfp8),
        ]
        reason = peers.torchao_available()
        if reason is None:
            cases.append(("MXFP8 vs torchao to_mx RCEIL", dtype, _refops_mxfp8, peers.torchao_to_mx))
        cases.append(("NVFP4 vs TE-style torch", dtype, _refops_nvfp4, peers.nvfp4))
    return cases


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.element_size() != b.element_size():
        return False
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
    return torch.equal(as_bytes(a), as_bytes(b))


def check_identical(name: str, ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    """Raise unless every output of refops equals the peer's, byte for byte."""
    for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
        if _same_bytes(a, b):
            continue
        if a.shape != b.shape or a.dtype != b.dtype:
            mismatch = f"{a.dtype} {tuple(a.shape)} vs {b.dtype} {tuple(b.shape)}"
        else:
            as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731
            mismatch = f"{int((as_bytes(a) != as_bytes(b)).sum())} bytes"
        raise AssertionError(f"{name}: output {i} of refops and the peer differ ({mismatch})")


def check_torchao(name: str, x: torch.Tensor, ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> str:
    """Byte identity outside the blocks where torchao's fp32 ``log2`` is known to round (see peers.py).

    Returns a note with the number of such blocks; raises if any other byte differs.
    """
    m, k = x.shape
    known = peers.torchao_log2_blocks(x)
    scale_differs = ours[1] != theirs[1]
    data_differs = (ours[0] != theirs[0]).reshape(m, k // 32, 32).any(dim=2)
    unexplained = (scale_differs | data_differs) & ~known
    if unexplained.any():
        raise AssertionError(f"{name}: {int(unexplained.sum())} blocks differ outside torchao's known log2 rounding")
    return f"{int((scale_differs | data_differs).sum())} of {known.numel()} blocks"


def interleaved_medians(a: Callable[[], Any], b: Callable[[], Any], reps: int) -> tuple[float, float]:
    """Median milliseconds of ``a`` and of ``b``, timed A B A B ... after one warm-up each."""
    a(), b()
    times_a, times_b = [], []
    for _ in range(reps):
        for fn, times in ((a, times_a), (b, times_b)):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times_a), statistics.median(times_b)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny tensors, one repeat (a smoke test)")
    parser.add_argument("--size", type=int, default=4096, help="the tensors are size x size (default 4096)")
    parser.add_argument("--reps", type=int, default=7, help="timed rounds per side (default 7)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    parser.add_argument("--only", default="", help="run only recipes whose name contains this text")
    args = parser.parse_args(argv)
    size, reps = (256, 1) if args.quick else (args.size, args.reps)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    reason = peers.torchao_available()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, tensors {size}x{size}, "
          f"{reps} interleaved rounds, medians")
    if reason is not None:
        print(f"torchao not installed: skipped ({reason})")
    header = f"{'recipe':<38} | {'input':<8} | {'refops ms':>9} | {'peer ms':>9} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    worst = 0.0
    inputs = {}
    notes: list[str] = []
    for name, dtype, ours, theirs in _cases(size):
        if args.only and args.only not in name:
            continue
        if dtype not in inputs:
            inputs[dtype] = torch.randn(size, size, dtype=torch.float32).mul_(3.0).to(dtype)
        x = inputs[dtype]
        dtype_name = str(dtype).replace("torch.", "")
        if "torchao" in name:
            differing = check_torchao(f"{name} ({dtype})", x, ours(x), theirs(x))
            notes.append(f"torchao ({dtype_name}): byte-identical except {differing} where its fp32 log2 "
                         "rounds amax/448 onto a power of two (TE rounds those scales up)")
        else:
            check_identical(f"{name} ({dtype})", ours(x), theirs(x))
        ms_ours, ms_theirs = interleaved_medians(lambda: ours(x), lambda: theirs(x), reps)
        ratio = ms_ours / ms_theirs
        worst = max(worst, ratio)
        print(f"{name:<38} | {dtype_name:<8} | {ms_ours:9.2f} | {ms_theirs:9.2f} | {ratio:6.2f}")
    for note in notes:
        print(note)
    print(f"byte-identical outputs: asserted for every row. worst ratio {worst:.2f} "
          f"(target refops/peer <= {TARGET:.1f}: {'met' if worst <= TARGET else 'NOT met'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
