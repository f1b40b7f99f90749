"""GEMMs: CUDA kernels (filled in by the GEMM work)."""

from __future__ import annotations

__all__ = ["GemmKernels"]


class GemmKernels:
    """Mixin overriding the gemm kernel of ``KernelBackend``."""
