"""A kernel backend that records the ``gemm_numerics`` mode in force at every GEMM (for the capture tests)."""

from __future__ import annotations

import refops
from refops.kernels import ReferenceKernels
from refops.kernels.gemm_numerics import gemm_role


class RecordingKernels(ReferenceKernels):
    """The reference kernels, recording ``(role, mode in force)`` of every GEMM."""

    name = "recording-reference"

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def gemm(self, a, b, *, trans_a=False, trans_b=False, role=None, **kwargs):
        self.calls.append((gemm_role(role, trans_a=trans_a, trans_b=trans_b), refops.gemm_numerics()))
        return super().gemm(a, b, trans_a=trans_a, trans_b=trans_b, role=role, **kwargs)
