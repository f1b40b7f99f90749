"""What LayerNorm and RMSNorm share: the normalized shape, the gamma parameter, input checks, output quantization."""

from __future__ import annotations

import numbers
from typing import Any, Iterable, Optional

import torch

from ...quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from .._common import check_tensor
from ..op import BasicOperation
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype
from ..sizes import check_size

__all__ = [
    "Normalization",
    "canonicalize_normalized_shape",
    "check_normalized_dims",
    "sm_margins",
    "quantize_norm_output",
]

#: The quantizers a norm may emit its output through (TE's list; anything else leaves it in high precision).
NORM_OUTPUT_QUANTIZERS = (
    Float8Quantizer,
    Float8CurrentScalingQuantizer,
    MXFP8Quantizer,
    Float8BlockQuantizer,
    NVFP4Quantizer,
)


def canonicalize_normalized_shape(normalized_shape: Iterable[int] | int, *, op_name: str) -> tuple[int, ...]:
    """An int ``n`` means ``(n,)``; every dim must be a positive int (``TypeError`` naming the op otherwise)."""
    if isinstance(normalized_shape, numbers.Integral) and not isinstance(normalized_shape, bool):
        return (check_size(op_name, "normalized_shape", normalized_shape),)
    try:
        shape = tuple(normalized_shape)
    except TypeError:
        raise TypeError(
            f"{op_name}: normalized_shape must be a positive int or a tuple of them, got {normalized_shape!r}"
        ) from None
    if not shape:
        raise ValueError(f"{op_name}: normalized_shape must not be empty")
    return tuple(check_size(op_name, f"normalized_shape[{i}]", d) for i, d in enumerate(shape))


def check_normalized_dims(op_name: str, input_: torch.Tensor, normalized_shape: tuple[int, ...]) -> None:
    """ValueError unless the input's trailing dims equal ``normalized_shape``."""
    dims = tuple(input_.shape)
    n = len(normalized_shape)
    if len(dims) < n or dims[len(dims) - n:] != normalized_shape:
        raise ValueError(
            f"{op_name}: input of shape {dims} does not end with normalized_shape {normalized_shape} "
            "(the shape of the weight)"
        )


def sm_margins(sm_margin: int | dict[str, int], *, op_name: str) -> dict[str, int]:
    """``{"forward", "backward", "inference"}`` SM margins from an int or a partial dict.

    SM margins only reserve GPU multiprocessors for overlapping kernels; the
    reference records them and otherwise ignores them.
    """
    keys = ("forward", "backward", "inference")
    if isinstance(sm_margin, int):
        return {k: sm_margin for k in keys}
    if not isinstance(sm_margin, dict) or set(sm_margin) - set(keys):
        raise ValueError(f"{op_name}: sm_margin must be an int or a dict with keys {keys}, got {sm_margin!r}")
    return {k: int(sm_margin.get(k, 0)) for k in keys}


def quantize_norm_output(y: torch.Tensor, next_op_input_quantizer: Any) -> torch.Tensor:
    """``y`` quantized by the next op's input quantizer when it is an FP8 / MXFP8 / FP8-block / NVFP4 one."""
    if isinstance(next_op_input_quantizer, NORM_OUTPUT_QUANTIZERS):
        return next_op_input_quantizer(y)
    return y


class Normalization(BasicOperation):
    """A normalization over the trailing ``normalized_shape`` dims with a ``weight`` (gamma) and, if
    ``has_bias``, a ``bias`` (beta). Gamma starts at ones (zeros if ``zero_centered_gamma``, the scale
    then being ``1 + gamma``); beta starts at zeros."""

    has_bias: bool = False

    def __init__(
        self,
        normalized_shape: Iterable[int] | int,
        *,
        eps: float = 1e-5,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        zero_centered_gamma: bool = False,
        sm_margin: int | dict[str, int] = 0,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        self._shape = canonicalize_normalized_shape(normalized_shape, op_name=name)
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self._sm_margins = sm_margins(sm_margin, op_name=name)
        self.weight = torch.nn.Parameter(torch.empty(self._shape, device=device, dtype=dtype))
        if self.has_bias:
            self.bias = torch.nn.Parameter(torch.empty(self._shape, device=device, dtype=dtype))
        self._initialize_or_defer(device)

    @property
    def normalized_shape(self) -> tuple[int, ...]:
        return self._shape

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        if name == "weight" and not self.zero_centered_gamma:
            tensor.fill_(1.0)
        else:
            tensor.zero_()

    def check_input(self, input_: torch.Tensor) -> None:
        name = type(self).__name__
        check_tensor(name, "input", input_, dtype=self.weight.dtype, device=self.parameter_device())
        check_normalized_dims(name, input_, self._shape)

    def extra_repr(self) -> str:
        return f"normalized_shape={self._shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"
