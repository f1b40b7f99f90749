"""Element-wise activations and their gated (GLU) variants.

A *unary* activation maps ``x`` to ``act(x)`` element by element. A *gated*
activation splits the last dim of ``x`` into halves ``a`` (first) and ``b``
(second) and computes ``gate(a) * b``: the output's last dim is half the
input's. TransformerEngine applies the gate to the **first** half;
``torch.nn.functional.glu`` applies it to the second.

Every op here is a thin shell around the kernel seam
(``current_backend().activation_forward`` / ``activation_backward``), which
computes in fp32 and rounds once to the compute dtype.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from ... import trace
from ...kernels import current_backend
from ...quantization.float8 import Float8CurrentScalingQuantizer
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.quantizer import DType
from .._common import check_tensor, compute_dtype, maybe_dequantize
from ..op import BasicOperation, OperationContext

__all__ = ["GELU", "GEGLU", "GLU", "QGELU", "QGEGLU", "ReLU", "ReGLU", "SReLU", "SReGLU", "SiLU"]


class _ActivationOperation(BasicOperation):
    """Apply ``act`` to the input; no parameters, no quantizers of its own.

    Forward: the compute dtype is the ``torch.autocast`` dtype if active, else
    the input's dtype (fp32, fp16 or bf16); a quantized input is dequantized to
    it; ``y = act(x)`` in that dtype. Backward: ``dx = act'(x) * dy`` (for gated
    activations, the product rule over both halves), in the compute dtype; a
    quantized ``dy`` is dequantized first.

    Quantized neighbours (the op has no quantizers, it uses theirs): ``y`` leaves
    quantized by the next op's input quantizer and ``dx`` by the previous op's
    grad-output quantizer (taken at forward time) when they exist, which is
    inside ``refops.autocast`` with a quantizing neighbour such as ``Quantize``
    or ``BasicLinear``. Then the op runs TE's fused activation + quantize: the
    activation (or ``dy * act'(x)``) in fp32 from the inputs, handed unrounded to
    :meth:`~refops.quantization.quantizer.Quantizer.quantize_unrounded`, which
    applies the scheme's rule: one rounding to FP8 for delayed scaling, the amax
    of the unrounded values for current scaling (``docs/recipes/fused-activations.md``).
    Unary activations ask the quantizer for the whole pass
    (``Quantizer.quantize_activation`` / ``quantize_activation_backward``: the
    same bits, one fused kernel on the fast path).

    Args:
        cache_quantized_input: save ``x`` for backward as an FP8 E4M3
            current-scaling, row-wise-only copy (``Float8CurrentScalingQuantizer``)
            instead of in high precision, and dequantize it in backward. Saves
            memory at the cost of FP8 error in ``dx`` (as in TransformerEngine,
            this applies with or without ``autocast``).
    """

    #: Name of the activation in the kernel table (``refops.kernels``).
    kernel_activation: ClassVar[str]
    #: Whether the activation halves the last dim (``gate(a) * b``).
    gated: ClassVar[bool] = False

    def __init__(self, *, cache_quantized_input: bool = False) -> None:
        super().__init__()
        self.cache_quantized_input: bool = cache_quantized_input

    def kernel_params(self) -> dict[str, Any]:
        """Keyword parameters passed to the activation kernels (none by default)."""
        return {}

    # ---------------------------------------------------------------- layout
    def _to_kernel_layout(self, x: torch.Tensor) -> torch.Tensor:
        """Check the input's last dim and bring it to the ``[a..., b...]`` layout the kernels expect."""
        if self.gated and (x.dim() == 0 or x.shape[-1] % 2 != 0):
            raise ValueError(
                f"{type(self).__name__}: a gated activation splits the last dim into two halves, "
                f"so it must be even; got input shape {tuple(x.shape)}"
            )
        return x

    def _from_kernel_layout(self, grad: torch.Tensor) -> torch.Tensor:
        """Inverse of :meth:`_to_kernel_layout` for the input gradient."""
        return grad

    # --------------------------------------------------------------- compute
    def _grad_input_quantizer(self, prev_op_grad_output_quantizer: Any) -> Any:
        """The quantizer ``dx`` leaves through (None: high precision)."""
        return prev_op_grad_output_quantizer

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
        check_tensor(name, "input", input_, dtype=input_.dtype)
        dtype = compute_dtype(name, input_, input_.dtype)
        x = maybe_dequantize(input_, dtype).contiguous()
        if next_op_input_quantizer is None:
            y = current_backend().activation_forward(self._to_kernel_layout(x), self.kernel_activation,
                                                     **self.kernel_params())
        else:
            y = activation_quantized(self, x, next_op_input_quantizer, dtype)
        if ctx.requires_grad:
            ctx.save_for_backward(cache_quantized(x) if self.cache_quantized_input else x)
            ctx.dtype = dtype
            ctx.prev_op_grad_output_quantizer = self._grad_input_quantizer(prev_op_grad_output_quantizer)
        return y

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, tuple[()]]:
        (x,) = ctx.saved_tensors
        x = maybe_dequantize(x, ctx.dtype)
        dy = maybe_dequantize(grad_output, ctx.dtype).contiguous()
        quantizer = ctx.prev_op_grad_output_quantizer
        if quantizer is None:
            dx = current_backend().activation_backward(dy, self._to_kernel_layout(x), self.kernel_activation,
                                                       **self.kernel_params())
            return self._from_kernel_layout(dx), ()
        trace.record("fused_quantize", type(self).__name__, instance=self, direction="backward",
                     quantizer=type(quantizer).__name__)
        method = getattr(quantizer, "quantize_activation_backward", None)
        if self.gated or method is None:
            return quantize_unrounded(quantizer, self.backward_fp32(dy, x), ctx.dtype), ()
        # A unary activation's kernel layout is its own: the quantizer's fused pass sees dy and x as they are.
        return method(dy, x, self.kernel_activation, dtype=ctx.dtype, **self.kernel_params()), ()

    def backward_fp32(self, dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``dy * act'(x)`` in fp32 from the (compute-dtype) ``dy`` and ``x``, not rounded, in ``x``'s layout."""
        dx = current_backend().activation_backward(dy.float(), self._to_kernel_layout(x).float(),
                                                   self.kernel_activation, **self.kernel_params())
        return self._from_kernel_layout(dx)


def activation_quantized(op: _ActivationOperation, x: torch.Tensor, quantizer: Any, dtype: torch.dtype) -> Any:
    """TE's fused activation + quantize: ``act(x)`` in fp32 from ``x`` (compute dtype), quantized unrounded.

    Invariant: the result is ``quantizer.quantize_unrounded(act_fp32(x), dtype=dtype)``, the rounding rule of
    the quantizer's scheme applied to values no kernel has rounded (``docs/recipes/fused-activations.md``).
    A unary activation hands ``x`` to the quantizer's
    :meth:`~refops.quantization.quantizer.Quantizer.quantize_activation` (one fused kernel where the scheme and
    the backend have one); gated activations, whose kernel layout may differ from the op's, compute ``act_fp32``
    here and hand it to ``quantize_unrounded``.
    """
    trace.record("fused_quantize", type(op).__name__, instance=op, direction="forward",
                 quantizer=type(quantizer).__name__)
    method = getattr(quantizer, "quantize_activation", None)
    if not op.gated and method is not None:
        return method(x, op.kernel_activation, dtype=dtype, **op.kernel_params())
    y32 = current_backend().activation_forward(op._to_kernel_layout(x).float(), op.kernel_activation,
                                               **op.kernel_params())
    return quantize_unrounded(quantizer, y32, dtype)


def quantize_unrounded(quantizer: Any, values: torch.Tensor, dtype: torch.dtype) -> Any:
    """``quantizer.quantize_unrounded(values, dtype=dtype)``; a quantizer-like callable without that method
    (a user's own) gets the unfused path, ``values`` rounded to ``dtype`` and then quantized."""
    method = getattr(quantizer, "quantize_unrounded", None)
    return quantizer(values.to(dtype)) if method is None else method(values, dtype=dtype)


def cache_quantized(x: torch.Tensor) -> QuantizedTensor:
    """The copy of ``x`` a ``cache_quantized_input`` activation saves: FP8 E4M3, current scaling, row-wise only."""
    quantizer = Float8CurrentScalingQuantizer(DType.kFloat8E4M3, x.device)
    quantizer.set_usage(rowwise=True, columnwise=False)
    quantizer.internal = True
    return quantizer(x)


class GELU(_ActivationOperation):
    """``GELU(x) = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (the tanh approximation)."""

    kernel_activation = "gelu"


class GEGLU(_ActivationOperation):
    """``GEGLU(a, b) = GELU(a) * b`` with the tanh-approximate GELU; gate on the first half."""

    kernel_activation = "geglu"
    gated = True


class GLU(_ActivationOperation):
    """``GLU(a, b) = sigmoid(a) * b``; gate on the first half (``torch.nn.functional.glu`` gates the second)."""

    kernel_activation = "glu"
    gated = True


class QGELU(_ActivationOperation):
    """Quick GELU: ``QGELU(x) = x * sigmoid(1.702 x)``."""

    kernel_activation = "qgelu"


class QGEGLU(_ActivationOperation):
    """``QGEGLU(a, b) = a * sigmoid(1.702 a) * b``; gate on the first half."""

    kernel_activation = "qgeglu"
    gated = True


class ReLU(_ActivationOperation):
    """``ReLU(x) = max(x, 0)``; the derivative at 0 is taken as 0."""

    kernel_activation = "relu"


class ReGLU(_ActivationOperation):
    """``ReGLU(a, b) = max(a, 0) * b``; gate on the first half."""

    kernel_activation = "reglu"
    gated = True


class SReLU(_ActivationOperation):
    """Squared ReLU: ``SReLU(x) = max(x, 0)^2``, derivative ``2 max(x, 0)``.

    (TransformerEngine's docstring writes ``max(x^2, 0)``; the formula it
    implements and tests is the one above.)
    """

    kernel_activation = "srelu"


class SReGLU(_ActivationOperation):
    """``SReGLU(a, b) = max(a, 0)^2 * b``; gate on the first half."""

    kernel_activation = "sreglu"
    gated = True


class SiLU(_ActivationOperation):
    """``SiLU(x) = x * sigmoid(x)`` (also called swish)."""

    kernel_activation = "silu"
