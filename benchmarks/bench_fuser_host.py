"""Host cost of refops's fuser on tiny tensors, against the same pipeline built from ``torch.nn`` modules.

Usage: ``python benchmarks/bench_fuser_host.py [--quick] [--reps R] [--threads T]``

Pipelines of N ops (N = 2, 4, 8, 16, 32) repeat ``Linear -> Bias -> GELU -> Linear`` (refops:
``BasicLinear``, ``Bias``, ``GELU``; torch.nn: ``Linear(bias=False)``, a one-parameter bias-add
module, ``GELU``) on a 4 x 16 fp32 input, so the arithmetic is negligible and the time is host cost.
refops runs them as one ``te.ops.Sequential`` (one fuser), torch.nn as ``torch.nn.Sequential``;
both start from the same weights, and their outputs are checked to agree before timing.

Each mode (forward with autograd recording, forward + backward) is timed as the median over
``reps`` rounds of a batch of calls, refops and torch.nn interleaved (A B A B ...). A least-squares
line through the N points gives each side's fixed cost per forward (the intercept) and cost per op
(the slope). Targets: refops's fixed cost under 200 us, its per-op cost under 2x torch.nn's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import refops as te
from refops.kernels import current_backend
from refops.ops.op import OperationContext

TARGET_FIXED_US = 200.0
TARGET_PER_OP_RATIO = 2.0
WIDTH = 16


class BiasAdd(torch.nn.Module):
    """What a torch.nn user writes for a standalone bias: ``x + bias``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.bias = torch.nn.Parameter(torch.zeros(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.bias


def build(n_ops: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    """``(refops Sequential, torch.nn.Sequential)`` of ``n_ops`` ops with identical parameters."""
    pattern = ["linear", "bias", "gelu", "linear"]
    ours, theirs = [], []
    for i in range(n_ops):
        kind = pattern[i % len(pattern)]
        if kind == "linear":
            ours.append(te.ops.BasicLinear(WIDTH, WIDTH, device="cpu"))  # a CPU benchmark, GPU or not
            theirs.append(torch.nn.Linear(WIDTH, WIDTH, bias=False))
            with torch.no_grad():
                theirs[-1].weight.copy_(ours[-1].weight)
        elif kind == "bias":
            ours.append(te.ops.Bias(WIDTH, device="cpu"))
            theirs.append(BiasAdd(WIDTH))
            with torch.no_grad():
                ours[-1].bias.normal_()
                theirs[-1].bias.copy_(ours[-1].bias)
        else:
            ours.append(te.ops.GELU())
            theirs.append(torch.nn.GELU(approximate="tanh"))
    return te.ops.Sequential(*ours), torch.nn.Sequential(*theirs)


def _forward(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    return lambda: model(x)


def _forward_backward(model: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    def step() -> None:
        model(x).sum().backward()
    return step


def interleaved_us(a: Callable[[], object], b: Callable[[], object], *, calls: int, reps: int) -> tuple[float, float]:
    """Median microseconds per call of ``a`` and ``b``: ``reps`` rounds of ``calls`` calls, A B A B."""
    for fn in (a, b):
        for _ in range(max(calls // 4, 1)):
            fn()
    rounds_a, rounds_b = [], []
    for _ in range(reps):
        for fn, rounds in ((a, rounds_a), (b, rounds_b)):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds_a), statistics.median(rounds_b)


def fit_line(ns: list[int], ts: list[float]) -> tuple[float, float]:
    """Least-squares ``(intercept, slope)`` of ``ts`` against ``ns``."""
    mean_n, mean_t = statistics.fmean(ns), statistics.fmean(ts)
    slope = sum((n - mean_n) * (t - mean_t) for n, t in zip(ns, ts)) / sum((n - mean_n) ** 2 for n in ns)
    return mean_t - slope * mean_n, slope


class _CountAtenOps(TorchDispatchMode):
    """Counts the ATen operations dispatched while active (each one is a trip through torch's dispatcher)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(fn: Callable[[], object]) -> int:
    with torch.no_grad(), _CountAtenOps() as counter:
        fn()
    return counter.count


def _kernel_call(name: str, op: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """The op's kernel alone, called on the active backend as the op calls it."""
    kernels = current_backend()
    if name == "BasicLinear":
        return lambda: kernels.gemm(x, op.weight, trans_b=True, out_dtype=x.dtype)
    if name == "Bias":
        return lambda: kernels.bias_activation_forward(x, op.bias, "identity")
    return lambda: kernels.activation_forward(x, op.kernel_activation)


def _op_hook_call(op: torch.nn.Module, x: torch.Tensor) -> Callable[[], object]:
    """The op's ``fuser_forward`` hook alone, as the fuser calls it for one basic op."""
    return lambda: op.fuser_forward([OperationContext()], x, basic_op_extra_inputs=[()],
                                    prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                                    basic_op_kwargs=[{}])


def per_op_floor(*, calls: int, reps: int) -> None:
    """Where the per-op cost goes, op by op: the ATen operations each side dispatches, the op's kernel
    alone, and its ``fuser_forward`` hook alone (the kernel plus the op's checks and bookkeeping).

    The reference computes each op as its recipe's formula, step by step (GELU's tanh form is nine
    fp32 operations, as TE's kernel evaluates it); each step is one dispatch. The dispatches alone
    bound refops's per-op cost from below, whatever the fuser does around them. What a pipeline's
    per-op cost adds to the hook is the fuser's per-op share (its loop, the parameter-cache check,
    the op's context and saved tensors, autograd's inputs).
    """
    x = torch.randn(4, WIDTH)
    dispatch_us, _ = interleaved_us(lambda: torch.add(x, x), lambda: None, calls=calls * 10, reps=reps)
    print(f"\nper-op floor: one small ATen operation costs {dispatch_us:.2f} us here; no grad below")
    print(f"{'op':<12} | {'ATen ops refops':>15} | {'torch.nn':>8} | {'kernel us':>9} | {'op hook us':>10} | "
          f"{'torch.nn us':>11} | {'dispatch floor / torch.nn':>25}")
    ours_seq, theirs_seq = build(4)
    ours_seq(x)  # the first forward (recipe state, fusions) happens once
    for i, name in enumerate(("BasicLinear", "Bias", "GELU")):
        op = ours_seq[i]
        n_ours, n_theirs = aten_ops(_op_hook_call(op, x)), aten_ops(lambda: theirs_seq[i](x))
        with torch.no_grad():
            kernel, _ = interleaved_us(_kernel_call(name, op, x), lambda: None, calls=calls, reps=reps)
            hook, theirs = interleaved_us(_op_hook_call(op, x), lambda: theirs_seq[i](x), calls=calls, reps=reps)
        print(f"{name:<12} | {n_ours:>15} | {n_theirs:>8} | {kernel:>9.1f} | {hook:>10.1f} | {theirs:>11.1f} | "
              f"{n_ours * dispatch_us / theirs:>25.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two sizes, one short round (a smoke test)")
    parser.add_argument("--reps", type=int, default=9, help="timed rounds per side (default 9)")
    parser.add_argument("--calls", type=int, default=200, help="calls per round (default 200)")
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads (default: all cores)")
    args = parser.parse_args(argv)
    ns = [2, 4] if args.quick else [2, 4, 8, 16, 32]
    reps, calls = (1, 5) if args.quick else (args.reps, args.calls)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, input 4x{WIDTH} fp32, "
          f"{reps} interleaved rounds of {calls} calls, medians (us per call)")
    header = f"{'mode':<18} | {'ops':>3} | {'refops us':>9} | {'torch.nn us':>11} | {'ratio':>6}"
    print(header)
    print("-" * len(header))
    ok = True
    for mode, make in (("forward", _forward), ("forward+backward", _forward_backward)):
        ours_t, theirs_t = [], []
        for n in ns:
            ours, theirs = build(n)
            x = torch.randn(4, WIDTH, requires_grad=True)
            y_ours, y_theirs = ours(x), theirs(x)
            if not torch.allclose(y_ours, y_theirs, rtol=1e-5, atol=1e-6):
                raise AssertionError(f"{n} ops: refops and torch.nn outputs differ")
            a, b = interleaved_us(make(ours, x), make(theirs, x), calls=calls, reps=reps)
            ours_t.append(a)
            theirs_t.append(b)
            print(f"{mode:<18} | {n:>3} | {a:9.1f} | {b:11.1f} | {a / b:6.2f}")
        fixed_ours, per_op_ours = fit_line(ns, ours_t)
        fixed_theirs, per_op_theirs = fit_line(ns, theirs_t)
        per_op_ratio = per_op_ours / per_op_theirs
        fixed_ok = fixed_ours < TARGET_FIXED_US
        ratio_ok = per_op_ratio < TARGET_PER_OP_RATIO
        ok = ok and fixed_ok and ratio_ok
        print(f"{mode}: fixed cost per forward refops {fixed_ours:.1f} us (torch.nn {fixed_theirs:.1f} us; "
              f"target < {TARGET_FIXED_US:.0f} us: {'met' if fixed_ok else 'NOT met'}); per op refops "
              f"{per_op_ours:.1f} us, torch.nn {per_op_theirs:.1f} us, ratio {per_op_ratio:.2f} "
              f"(target < {TARGET_PER_OP_RATIO:.1f}: {'met' if ratio_ok else 'NOT met'})")
        # The 4-op pipeline on its own, the figure the issue quotes.
        if 4 in ns:
            i = ns.index(4)
            print(f"{mode}: 4-op pipeline refops {ours_t[i]:.1f} us vs torch.nn.Sequential {theirs_t[i]:.1f} us, "
                  f"ratio {ours_t[i] / theirs_t[i]:.2f}")
    print(f"targets: {'all met' if ok else 'NOT all met'}")
    per_op_floor(calls=calls, reps=reps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
