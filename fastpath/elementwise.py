"""Activations, bias + activation, dbias: CUDA kernels (filled in by the elementwise work)."""

from __future__ import annotations

__all__ = ["ElementwiseKernels"]


class ElementwiseKernels:
    """Mixin overriding the element-wise kernels of ``KernelBackend``."""
