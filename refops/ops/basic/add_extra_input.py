"""``AddExtraInput``: add a tensor passed to the fuser (or routed from an earlier op) to the input."""

from __future__ import annotations

from typing import Any, Iterable, Optional

import torch

from .._common import maybe_dequantize
from ..op import FuserOnlyOperation, OperationContext

__all__ = ["AddExtraInput"]


def check_same_layout(op_name: str, what: str, tensor: torch.Tensor, like: torch.Tensor, like_name: str) -> None:
    """Raise unless ``tensor`` has ``like``'s shape, dtype and device (nothing is broadcast or cast)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{op_name}: expected {what} to be a torch.Tensor, got {type(tensor).__name__}")
    if tensor.shape != like.shape:
        raise ValueError(
            f"{op_name}: {what} has shape {tuple(tensor.shape)} but {like_name} has shape {tuple(like.shape)}; "
            "they must match (no broadcasting)"
        )
    if tensor.dtype != like.dtype:
        raise TypeError(
            f"{op_name}: {what} has dtype {tensor.dtype} but {like_name} has dtype {like.dtype}; "
            "cast one of them explicitly (refops never casts silently)"
        )
    if tensor.device != like.device:
        raise ValueError(f"{op_name}: {what} is on {tensor.device} but {like_name} is on {like.device}")


class AddExtraInput(FuserOnlyOperation):
    """``y = x + e`` where ``e`` is the op's one extra input. Backward: ``dx = dy``, ``de = dy``.

    ``e`` must have the input's shape, dtype and device. With ``in_place=True``
    the sum is written into ``e`` itself (outside autograd) and ``y`` *is* that
    buffer: the caller's tensor is overwritten and aliased by the output. This is
    what the ``ForwardLinearBiasAdd`` / ``ForwardLinearScaleAdd`` fusions need.

    Quantized tensors: out of place, both operands are dequantized and ``y`` is
    high precision. In place into a quantized ``e``, the sum is re-quantized into
    ``e`` with its own quantizer (so ``y`` carries that quantization error, as in
    TE). The grads ``dx = de = dy`` are passed on unchanged, quantized or not.

    Args:
        in_place: accumulate into the extra input's memory.
    """

    num_extra_inputs: int = 1

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
        name = type(self).__name__
        (extra,) = basic_op_extra_inputs[0]
        check_same_layout(name, "the extra input", extra, input_, "the input")
        x = maybe_dequantize(input_, input_.dtype)
        if self._in_place:
            output = extra.detach()
            output += x  # a quantized extra input is re-quantized in place
        else:
            output = maybe_dequantize(extra, extra.dtype) + x
        return output, [()]

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
        return grad_output, [()], [(grad_output,)]

    def extra_repr(self) -> str:
        return f"in_place={self._in_place}"
