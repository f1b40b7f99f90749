"""refops: a readable reference for fused-operation pipelines and low-precision recipes.

``import refops as te`` reads like TransformerEngine code: ``te.ops.Linear(...)``,
``te.autocast(recipe=...)``, ``te.quantized_model_init(...)``.
"""

from . import common, ops, recipe
from .kernels import HopperGemmError, gemm_numerics, use_backend
from .quantization import (
    DType,
    Float8BlockQuantizer,
    Float8BlockwiseQTensor,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    Float8Tensor,
    MXFP8Quantizer,
    MXFP8Tensor,
    NVFP4Quantizer,
    NVFP4Tensor,
    QuantizedTensor,
    Quantizer,
    QuantizerRole,
)
from .quantization.state import (
    autocast,
    fp8_autocast,
    fp8_model_init,
    get_default_recipe,
    quantized_model_init,
)
from .quantization.support import (
    is_bf16_available,
    is_fp8_available,
    is_fp8_block_scaling_available,
    is_mxfp8_available,
    is_nvfp4_available,
)
from .graphs import make_graphed_callables
from .trace import trace
from . import sharding  # noqa: E402  (fills the hooks the layers below dispatch through)

from .version import __version__  # noqa: E402

__all__ = [
    "DType",
    "Float8BlockQuantizer",
    "Float8BlockwiseQTensor",
    "Float8CurrentScalingQuantizer",
    "Float8Quantizer",
    "Float8Tensor",
    "HopperGemmError",
    "MXFP8Quantizer",
    "MXFP8Tensor",
    "NVFP4Quantizer",
    "NVFP4Tensor",
    "QuantizedTensor",
    "Quantizer",
    "QuantizerRole",
    "autocast",
    "common",
    "fp8_autocast",
    "fp8_model_init",
    "gemm_numerics",
    "get_default_recipe",
    "is_bf16_available",
    "is_fp8_available",
    "is_fp8_block_scaling_available",
    "is_mxfp8_available",
    "is_nvfp4_available",
    "make_graphed_callables",
    "ops",
    "quantized_model_init",
    "recipe",
    "trace",
    "use_backend",
    "__version__",
]
