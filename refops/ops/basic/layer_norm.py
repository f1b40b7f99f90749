"""``LayerNorm``: normalize over the trailing dims, then scale and shift."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ...kernels import current_backend
from ...quantization import (
    Float8BlockQuantizer,
    Float8CurrentScalingQuantizer,
    Float8Quantizer,
    MXFP8Quantizer,
    NVFP4Quantizer,
)
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype

__all__ = [
    "LayerNorm",
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
    """An int ``n`` means ``(n,)``; every dim must be a positive int."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not shape or any(not isinstance(d, int) or isinstance(d, bool) or d <= 0 for d in shape):
        raise ValueError(f"{op_name}: normalized_shape must be positive ints, got {normalized_shape!r}")
    return shape


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


class LayerNorm(BasicOperation):
    """``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over the trailing ``normalized_shape`` dims.

    ``Var`` is the biased (population) variance. With ``zero_centered_gamma`` the
    scale is ``1 + gamma`` instead of ``gamma``.

    Parameters (shape ``normalized_shape``): ``weight`` (gamma) starts at ones,
    or zeros if ``zero_centered_gamma``; ``bias`` (beta) starts at zeros.

    Dtypes: computes in the ``torch.autocast`` dtype when active, else the
    weight's dtype; the input and the parameters are cast to it, the output is in
    it, and the statistics are fp32.

    Backward: ``(dx, dgamma, dbeta)`` from the saved ``(x, mean, rstd)``.

    Quantization: a quantized input (or grad-output) is dequantized first. When
    the next op offers an input quantizer (inside ``refops.autocast``: a
    ``BasicLinear``, a ``Quantize``...) of an FP8, MXFP8, FP8-block or NVFP4
    scheme, ``y`` leaves quantized by it, the high-precision result quantized
    once (TE's fused norm + cast); the grad-input is always high precision.

    Args:
        normalized_shape: int or tuple of ints; the input's trailing dims.
        eps: added to the variance.
        device: where the parameters live; ``"meta"`` defers allocation.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        zero_centered_gamma: use ``1 + gamma`` as the scale.
        sm_margin: GPU multiprocessors to leave free (int, or dict per
            "forward"/"backward"/"inference"); performance only.
    """

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

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        name = type(self).__name__
        if kwargs:
            raise TypeError(f"{name}: unexpected forward kwargs {sorted(kwargs)}")
        weight = self.weight
        dtype = compute_dtype(name, input_, weight.dtype)
        check_tensor(name, "input", input_, dtype=weight.dtype, device=weight.device)
        check_normalized_dims(name, input_, self._shape)
        x = maybe_dequantize(input_, dtype)
        y, mean, rstd = current_backend().layer_norm_forward(
            x,
            to_compute_dtype(weight, dtype),
            to_compute_dtype(self.bias, dtype),
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            out_dtype=dtype,
        )
        if ctx.requires_grad:
            ctx.save_for_backward(x, mean, rstd)
        ctx.dtype = dtype
        return quantize_norm_output(y, next_op_input_quantizer)

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, list[Optional[torch.Tensor]]]:
        x, mean, rstd = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, ctx.dtype).reshape(x.shape)
        dx, dw, db = current_backend().layer_norm_backward(
            dy, x, mean, rstd, to_compute_dtype(self.weight, ctx.dtype), zero_centered_gamma=self.zero_centered_gamma
        )
        return dx.reshape(grad_output.shape), [dw.reshape(self._shape), db.reshape(self._shape)]

    def extra_repr(self) -> str:
        return f"normalized_shape={self._shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}"

