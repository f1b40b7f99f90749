"""Quantize, dequantize and amax for every recipe: CUDA kernels (filled in by the quantization work)."""

from __future__ import annotations

__all__ = ["QuantizeKernels"]


class QuantizeKernels:
    """Mixin overriding the quantization kernels of ``KernelBackend``."""
