"""The reference implementation of the kernel interface, in plain torch."""

from .backend import ReferenceKernels

__all__ = ["ReferenceKernels"]
