"""``Quantize``: cast the tensor to the active recipe's format, forward and/or backward."""

from __future__ import annotations

from typing import Any

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.state import get_autocast_recipe
from ..op import BasicOperation, OperationContext

__all__ = ["Quantize"]


class Quantize(BasicOperation):
    """``y = Q(x)`` and ``dx = Q(dy)`` with the recipe of the enclosing ``refops.autocast``.

    Outside ``autocast`` (no recipe) the op is the identity. Inside it:

    * forward, if ``forward``: ``x`` is quantized with forward quantizer 0 into a
      full :class:`~refops.quantization.QuantizedTensor` (one the caller can
      hold); an input that is already quantized passes through unchanged;
    * backward, if ``backward``: ``dy`` is quantized with backward quantizer 0,
      provided quantization was enabled during the forward, the recipe has no
      ``backward_override`` and ``dy`` is not already quantized; otherwise it
      passes through.

    Values are never changed beyond the quantization itself. The op's main use is
    to *offer* its quantizers to its neighbours: the op before it sees
    ``get_input_quantizer()`` and may emit its output already quantized (which
    this op then passes through), and the op after it sees
    ``get_grad_output_quantizer()`` and may emit a quantized grad-input.

    Quantizers: forward 1 if ``forward`` else 0; backward 1 if ``backward`` else 0
    (no roles: "input" and "grad_output").

    Args:
        forward: quantize in the forward pass.
        backward: quantize in the backward pass.
    """

    def __init__(self, forward: bool = True, backward: bool = False) -> None:
        super().__init__()
        self._quantize_forward = bool(forward)
        self._quantize_backward = bool(backward)

    def num_quantizers(self, mode: str) -> int:
        if mode == "forward":
            return int(self._quantize_forward)
        if mode == "backward":
            return int(self._quantize_backward)
        return 0

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        recipe = get_autocast_recipe()
        enabled = recipe is not None and self._quantizers is not None
        output = input_
        if enabled and self._quantize_forward and not isinstance(input_, QuantizedTensor):
            output = self.get_quantizer("forward", 0)(input_)
        ctx.quantize_backward = (
            enabled and self._quantize_backward and getattr(recipe, "backward_override", None) is None
        )
        return output

    def op_backward(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
        if ctx.quantize_backward and not isinstance(grad_output, QuantizedTensor):
            return self.get_quantizer("backward", 0)(grad_output), []
        return grad_output, []

    def extra_repr(self) -> str:
        return f"forward={self._quantize_forward}, backward={self._quantize_backward}"
