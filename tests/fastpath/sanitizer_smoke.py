"""Run every fast-path kernel once on small shapes and check it against the reference.

    compute-sanitizer --tool memcheck  python tests/fastpath/sanitizer_smoke.py [CASE_SUBSTRING ...]
    compute-sanitizer --tool racecheck python tests/fastpath/sanitizer_smoke.py [CASE_SUBSTRING ...]

Not a pytest module (the sanitizers slow every launch a hundredfold): a script that
runs the benchmark's kernel cases (every quantize / dequantize / activation / norm
method) and the GEMM paths on a few small shapes, including ones with partial
tiles, and exits non-zero if any result differs from the reference. Quantized
bytes and dequantized values must be identical; other results within the
tolerance of their dtype. Kernels that only large inputs take (the SiTU-GLU table kernel) are
forced on. Arguments, if any, keep only the cases whose name contains one of them. GPU only.
"""

from __future__ import annotations

import sys

import torch

import fastpath
from refops.kernels import ReferenceKernels, get_backend, register_backend

#: (rows, cols): full tiles, partial 128-tiles in both dims, a single 32-row MXFP8 block row.
SHAPES = ((256, 512), (160, 224), (32, 96))
ACTIVATIONS = ("gelu", "relu", "srelu", "silu", "swiglu", "geglu", "qgeglu", "clamped_swiglu", "situglu")
PARAMS = {"clamped_swiglu": {"limit": 7.0, "alpha": 1.702, "glu_linear_offset": 1.0},
          "situglu": {"beta1": 4.0, "beta2": 25.0}}
EXACT_FAMILIES = {"quantize", "dequantize"}


def _tensors(result) -> list:
    return list(result) if isinstance(result, (tuple, list)) else [result]


def _identical(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN where the other is NaN (payloads may differ)."""
    if not a.is_floating_point() or a.element_size() == 1:
        return torch.equal(a.view(torch.uint8) if a.element_size() == 1 else a,
                           b.view(torch.uint8) if b.element_size() == 1 else b)
    nan = a.isnan()
    return torch.equal(nan, b.isnan()) and torch.equal(a[~nan], b[~nan])


def _same(name: str, family: str, got, want) -> list[str]:
    problems = []
    for i, (g, w) in enumerate(zip(_tensors(got), _tensors(want), strict=True)):
        if g is None or w is None:
            if (g is None) != (w is None):
                problems.append(f"{name}[{i}]: one backend returned None")
            continue
        w = w.to(g.device)
        if family in EXACT_FAMILIES:
            if g.shape != w.shape or g.dtype != w.dtype:
                problems.append(f"{name}[{i}]: {g.dtype}{tuple(g.shape)} vs {w.dtype}{tuple(w.shape)}")
            elif not _identical(g, w):
                problems.append(f"{name}[{i}]: not bit-identical")
        else:
            try:
                torch.testing.assert_close(g, w, equal_nan=True, atol=2e-2, rtol=2e-2)
            except AssertionError as exc:
                problems.append(f"{name}[{i}]: {str(exc).splitlines()[0]}")
    return problems


def main(wanted: list[str]) -> int:
    reason = fastpath.unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    from fastpath.benchmark.kernel_cases import kernel_cases
    from fastpath import elementwise

    # The bf16 SiTU-GLU table kernel normally runs from 2^20 outputs on: here on every shape, with a bias too.
    elementwise._SITU_TABLE_MIN_OUTPUTS = 0
    elementwise._SITU_TABLE_WITH_BIAS = True
    register_backend("fastpath", fastpath.make_backend)
    fast, ref = get_backend("fastpath"), ReferenceKernels()
    problems, ran = [], 0
    for rows, cols in SHAPES:
        torch.manual_seed(rows * cols)
        x = (torch.randn(rows, cols, device="cuda") * 3).to(torch.bfloat16)
        for case in kernel_cases(fast, x, ACTIVATIONS, PARAMS):
            if case.fn is not None:  # one kernel of a method timed alone; the method's own case checks it
                continue
            if wanted and not any(w in case.name for w in wanted):
                continue
            got = getattr(fast, case.method)(*case.args, **case.kwargs)
            want = getattr(ref, case.method)(*case.args, **case.kwargs)
            problems += _same(f"{case.name} {rows}x{cols}", case.family, got, want)
            ran += 1
        w = (torch.randn(cols, cols, device="cuda") * 0.05).to(torch.bfloat16)
        for trans_b in (False, True) if not wanted or any("gemm" in w for w in wanted) else ():
            got = fast.gemm(x, w, trans_b=trans_b, out_dtype=torch.bfloat16)
            want = ref.gemm(x, w, trans_b=trans_b, out_dtype=torch.bfloat16)
            problems += _same(f"gemm trans_b={trans_b} {rows}x{cols}", "gemm", got, want)
            ran += 1
    torch.cuda.synchronize()
    for line in problems:
        print("MISMATCH", line)
    print(f"{ran} kernel calls checked, {len(problems)} mismatches")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
