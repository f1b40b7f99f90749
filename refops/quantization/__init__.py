"""Quantized tensors and their quantizers, one module per scaling scheme.

``QuantizedTensor`` (:mod:`.quantized_tensor`) is the tensor type; each scheme
module holds its tensor subclass and quantizer(s):

* :mod:`.float8`: per-tensor FP8, delayed (``Float8Quantizer``) and current
  (``Float8CurrentScalingQuantizer``) scaling -> ``Float8Tensor``;
* :mod:`.mxfp8`: ``MXFP8Quantizer`` -> ``MXFP8Tensor``;
* :mod:`.float8_block`: ``Float8BlockQuantizer`` -> ``Float8BlockwiseQTensor``;
* :mod:`.nvfp4`: ``NVFP4Quantizer`` -> ``NVFP4Tensor``.

:mod:`.support` answers TE's ``check_*_support`` queries (every recipe runs here).

The arithmetic lives behind the kernel seam (``refops.kernels``).
"""

from . import _dispatch  # noqa: F401  (fills QuantizedTensor's torch-dispatch handler table)
from .float8 import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from .float8_block import Float8BlockQuantizer, Float8BlockwiseQTensor
from .mxfp8 import MXFP8Quantizer, MXFP8Tensor
from .nvfp4 import NVFP4Quantizer, NVFP4Tensor
from .quantized_tensor import QuantizedTensor
from .quantizer import DType, Quantizer, QuantizerRole
from .support import (
    check_fp8_block_scaling_support,
    check_fp8_support,
    check_mxfp8_support,
    check_nvfp4_support,
    check_recipe_support,
)

__all__ = [
    "QuantizedTensor",
    "Quantizer",
    "QuantizerRole",
    "DType",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8Tensor",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "check_fp8_support",
    "check_mxfp8_support",
    "check_nvfp4_support",
    "check_fp8_block_scaling_support",
    "check_recipe_support",
]
