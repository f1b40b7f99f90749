"""``MakeExtraOutput``: also hand the current tensor out of the fuser (a branch in the graph)."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from .._common import maybe_dequantize
from ..op import FuserOnlyOperation, OperationContext

__all__ = ["MakeExtraOutput"]


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class MakeExtraOutput(FuserOnlyOperation):
    """``y = x`` and extra output ``x``: both are the input tensor itself, not copies.

    Backward, with ``g`` the grad of the extra output (None if it was unused):
    ``dx = dy`` if ``g`` is None, else ``dx = g + dy``. With ``in_place=True`` the
    sum is accumulated into ``g`` itself (``g += dy``) and ``g`` is returned as
    ``dx``, which is what the ``BackwardLinearAdd`` fusion needs. In-place grad
    accumulation mutates a tensor autograd handed over; use it only when nothing
    else reads that grad. When ``g`` and ``dy`` share memory (a channel consumer
    such as ``AddExtraInput`` returns one tensor as both its grads) the sum is
    computed out of place: the value is the same, and ``dy`` is not clobbered.

    Quantized tensors pass through the forward unchanged (both outputs are the
    input object). In backward, a sum with a quantized grad is formed out of place
    on the dequantized values; a lone quantized grad is passed on unchanged.

    Args:
        in_place: accumulate the grad into the extra output's grad.
    """

    num_extra_outputs: int = 1

    def __init__(self, *, in_place: bool = False) -> None:
        super().__init__()
        self._in_place = in_place

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, Iterable[Iterable[torch.Tensor]]]:
        return input_, [(input_,)]

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[
        torch.Tensor,
        Iterable[Iterable[Optional[torch.Tensor]]],
        Iterable[Iterable[Optional[torch.Tensor]]],
    ]:
        (grad_extra,) = basic_op_grad_extra_outputs[0]
        if grad_extra is None:
            grad_input = grad_output
        elif isinstance(grad_extra, QuantizedTensor) or isinstance(grad_output, QuantizedTensor):
            dy = maybe_dequantize(grad_output, grad_output.dtype)
            grad_input = maybe_dequantize(grad_extra, grad_extra.dtype) + dy
        elif self._in_place and not _shares_memory(grad_extra, grad_output):
            grad_extra += grad_output
            grad_input = grad_extra
        else:
            grad_input = grad_extra + grad_output
        return grad_input, [()], [()]

    def extra_repr(self) -> str:
        return f"in_place={self._in_place}"
