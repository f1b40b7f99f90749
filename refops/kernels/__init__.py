"""The kernel interface (the seam between ops and arithmetic) and backend selection."""

from .interface import KernelBackend
from .reference import ReferenceKernels
from .registry import available_backends, current_backend, get_backend, register_backend, use_backend

__all__ = [
    "KernelBackend",
    "ReferenceKernels",
    "available_backends",
    "current_backend",
    "get_backend",
    "register_backend",
    "use_backend",
]
