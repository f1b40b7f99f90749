"""The oracle: helpers for comparing implementations with the reference."""

from .tolerances import dtype_tols, gemm_tols, quantization_tols

__all__ = ["dtype_tols", "gemm_tols", "quantization_tols"]
