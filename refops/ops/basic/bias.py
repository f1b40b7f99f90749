"""``Bias``: ``y = x + b`` broadcast over the leading dims."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..collectives import get_group_size
from ...kernels import current_backend
from ...quantization.quantized_tensor import QuantizedTensor
from ...quantization.state import get_autocast_recipe
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype
from ..sizes import check_size

__all__ = ["Bias"]


class Bias(BasicOperation):
    """``y = x + b``; ``b`` of shape ``(local_size,)`` (``size`` without TP) starts at zero.

    Backward: ``dx = dy`` and ``db = sum of dy over the leading dims`` (fp32 sum).

    Quantization: a quantized input is dequantized (the output is always high
    precision). Inside ``refops.autocast`` the previous op's grad-output
    quantizer, taken at forward time, becomes the grad-input quantizer (None
    when the recipe has a ``backward_override``); with it the backward returns
    ``dx = Q(dy)`` alongside ``db`` computed from the high-precision ``dy``
    (TE's fused ``bgrad_quantize``). A ``dy`` that arrives quantized is
    dequantized for ``db`` and passed on unchanged.

    Args:
        size: the last dim of the full output; with ``tensor_parallel`` each rank
            holds ``size / W`` of it (``ValueError`` if not divisible).
        device: where ``bias`` lives; ``"meta"`` defers allocation.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        tensor_parallel: shard the bias over ``tensor_parallel_group`` (a group of
            one rank, or no process group, turns it off).
        tensor_parallel_group: the ``torch.distributed`` group (None: the default group).
    """

    def __init__(
        self,
        size: int,
        *,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel: bool = False,
        tensor_parallel_group: Any = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        size = check_size(name, "size", size)
        group_size = get_group_size(tensor_parallel_group, owner=f"{name}: tensor_parallel_group")
        world = group_size if tensor_parallel else 1
        if size % world:
            raise ValueError(
                f"{name}: tensor parallelism shards size={size}, which is not divisible by the tensor-parallel "
                f"group size {world}"
            )
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.size = size
        self.local_size = size // world
        self.tensor_parallel = world > 1
        self.tensor_parallel_group = tensor_parallel_group if world > 1 else None
        self.tensor_parallel_size = world
        self.bias = torch.nn.Parameter(torch.empty(self.local_size, device=device, dtype=dtype))
        self._initialize_or_defer(device)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        tensor.zero_()

    def check_input(self, input_: torch.Tensor) -> None:
        check_tensor(type(self).__name__, "input", input_, dtype=self.bias.dtype, device=self.parameter_device(),
                     last_dim=self.local_size,
                     last_dim_name="size" if self.local_size == self.size else "local size")

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
        bias = self.bias
        dtype = compute_dtype(name, input_, bias.dtype)
        check_tensor(name, "input", input_, dtype=bias.dtype, device=bias.device, last_dim=self.local_size,
                     last_dim_name="size" if self.local_size == self.size else "local size")
        x = maybe_dequantize(input_, dtype)
        y, _ = current_backend().bias_activation_forward(x, to_compute_dtype(bias, dtype), "identity")
        ctx.dtype = dtype
        ctx.grad_input_quantizer = self._grad_input_quantizer(ctx, prev_op_grad_output_quantizer)
        return y

    @staticmethod
    def _grad_input_quantizer(ctx: OperationContext, prev_op_grad_output_quantizer: Any) -> Any:
        """The quantizer the grad-input leaves through (also read by ``BackwardActivationBias``)."""
        if not ctx.requires_grad:
            return None
        recipe = get_autocast_recipe()
        if recipe is not None and recipe.backward_override is not None:
            return None
        if prev_op_grad_output_quantizer is not None and not _produces_data(prev_op_grad_output_quantizer):
            return None  # its owner runs no backward (frozen, input without grad): nothing to quantize for it
        return prev_op_grad_output_quantizer

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, list[Optional[torch.Tensor]]]:
        # A custom forward fusion may leave the context empty: then nothing is quantized.
        quantized = isinstance(grad_output, QuantizedTensor)
        dy = grad_output.dequantize(dtype=getattr(ctx, "dtype", grad_output.dtype)) if quantized else grad_output
        if dy.dim() == 1:
            return grad_output, [dy]
        db = current_backend().dbias(dy)
        quantizer = getattr(ctx, "grad_input_quantizer", None)
        if quantized or quantizer is None or not _produces_data(quantizer):
            return grad_output, [db]
        return quantizer(dy), [db]


def _produces_data(quantizer: Any) -> bool:
    """False for a quantizer with neither usage: its owner (the previous op) needs no backward."""
    return getattr(quantizer, "rowwise_usage", True) or getattr(quantizer, "columnwise_usage", True)
