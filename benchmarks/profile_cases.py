"""Run chosen benchmark kernel cases once each, for a profiler (Nsight Compute) to capture their kernels.

    FASTPATH_LINEINFO=1 ncu --section ... python benchmarks/profile_cases.py "nvfp4 col -> bf16" "LayerNorm backward"

Case names are those of the benchmark's kernel table (``fastpath.benchmark``) (substrings match); the tensor is the same
16384 x 8192 bf16 shape. Needs a GPU with CuPy.
"""

from __future__ import annotations

import sys

import torch

import fastpath
from fastpath.benchmark.kernel_cases import kernel_cases
from fastpath.benchmark.runner import ACTIVATION_PARAMS, FULL


def main(wanted: list[str]) -> int:
    reason = fastpath.unavailable_reason()
    if reason:
        print(f"profile_cases.py needs a GPU with CuPy: {reason}")
        return 1
    from fastpath.elementwise import GATED_ACTIVATIONS, UNARY_ACTIVATIONS
    from refops.kernels import get_backend, register_backend

    register_backend("fastpath", fastpath.make_backend)
    backend = get_backend("fastpath")
    x = torch.randn(*FULL["kernel_shape"], dtype=torch.bfloat16, device="cuda")
    cases = kernel_cases(backend, x, UNARY_ACTIVATIONS + GATED_ACTIVATIONS, ACTIVATION_PARAMS)
    for case in cases:
        if any(w in case.name for w in wanted):
            case.callable_on(backend)()
            torch.cuda.synchronize()
            print("ran", case.name, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
