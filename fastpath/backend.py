"""``FastpathKernels``: the kernel interface, CUDA kernels where they exist, the reference elsewhere."""

from __future__ import annotations

from refops.kernels import ReferenceKernels

from .activation_quantize import ActivationQuantizeKernels
from .elementwise import ElementwiseKernels
from .gemm import GemmKernels
from .norms import NormKernels
from .quantize import QuantizeKernels
from .quantize_nvfp4 import Nvfp4Kernels

__all__ = ["FastpathKernels"]


class FastpathKernels(ActivationQuantizeKernels, QuantizeKernels, Nvfp4Kernels, GemmKernels, NormKernels,
                      ElementwiseKernels, ReferenceKernels):
    """Each mixin overrides the kernels of one family and calls ``super()`` (the reference) for
    inputs it does not handle (CPU tensors, unsupported dtypes or layouts)."""

    name = "fastpath"
