"""CuPy CUDA kernels implementing ``refops.kernels.KernelBackend``.

Select it with ``refops.use_backend("fastpath")`` (``refops`` finds it through the
``refops.backends`` entry point; it never imports this package itself). Every
kernel computes what the reference computes: quantization bit for bit, GEMMs
and reductions within the recipe's tolerance. Tensors on the CPU, and kernels
the fast path does not accelerate, fall back to the reference arithmetic.
"""

from .availability import is_available, unavailable_reason

__all__ = ["is_available", "unavailable_reason", "make_backend"]


def make_backend():  # noqa: ANN201 - returns a refops KernelBackend
    """The fast-path backend; raises RuntimeError with the reason when it cannot run here."""
    from .backend import FastpathKernels

    reason = unavailable_reason()
    if reason:
        raise RuntimeError(f"the fastpath backend is unavailable: {reason}")
    return FastpathKernels()
