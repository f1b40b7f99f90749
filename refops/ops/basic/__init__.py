"""Basic operations: each owns its parameters and knows its own forward and backward."""

from .activation import GELU, GEGLU, GLU, QGELU, QGEGLU, ReGLU, ReLU, SiLU, SReGLU, SReLU
from .add_extra_input import AddExtraInput
from .all_gather import AllGather
from .all_reduce import AllReduce
from .basic_linear import BasicLinear
from .bias import Bias
from .constant_scale import ConstantScale
from .dropout import Dropout
from .grouped_linear import GroupedLinear
from .identity import Identity
from .l2normalization import L2Normalization
from .layer_norm import LayerNorm
from .make_extra_output import MakeExtraOutput
from .quantize import Quantize
from .reduce_scatter import ReduceScatter
from .reshape import Reshape
from .rms_norm import RMSNorm
from .scaled_activation import ScaledClampedQGeGLU, ScaledSiTUGLU, ScaledSReLU, ScaledSwiGLU
from .swiglu import ClampedSwiGLU, SiTUGLU, SwiGLU

__all__ = [
    "AddExtraInput",
    "AllGather",
    "AllReduce",
    "BasicLinear",
    "Bias",
    "ClampedSwiGLU",
    "ConstantScale",
    "Dropout",
    "GELU",
    "GEGLU",
    "GLU",
    "GroupedLinear",
    "Identity",
    "L2Normalization",
    "LayerNorm",
    "MakeExtraOutput",
    "QGELU",
    "QGEGLU",
    "Quantize",
    "ReGLU",
    "ReduceScatter",
    "ReLU",
    "Reshape",
    "RMSNorm",
    "ScaledClampedQGeGLU",
    "ScaledSiTUGLU",
    "ScaledSReLU",
    "ScaledSwiGLU",
    "SiLU",
    "SiTUGLU",
    "SReGLU",
    "SReLU",
    "SwiGLU",
]
