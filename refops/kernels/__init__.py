"""The kernel interface (the seam between ops and arithmetic) and backend selection."""

from .gemm_numerics import GEMM_NUMERICS, HopperGemmError, gemm_numerics
from .gemm_operand import GemmOperand
from .interface import KernelBackend
from .reference import ReferenceKernels
from .registry import available_backends, current_backend, get_backend, register_backend, use_backend

__all__ = [
    "GEMM_NUMERICS",
    "GemmOperand",
    "HopperGemmError",
    "KernelBackend",
    "ReferenceKernels",
    "available_backends",
    "current_backend",
    "gemm_numerics",
    "get_backend",
    "register_backend",
    "use_backend",
]
