"""``Bias``: ``y = x + b`` broadcast over the leading dims."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype

__all__ = ["Bias"]


class Bias(BasicOperation):
    """``y = x + b``; ``b`` of shape ``(size,)`` starts at zero.

    Backward: ``dx = dy`` and ``db = sum of dy over the leading dims`` (fp32 sum).

    Args:
        size: the last dim of the input.
        device: where ``bias`` lives; ``"meta"`` defers allocation.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        tensor_parallel, tensor_parallel_group: distributed options; only
            ``tensor_parallel=False`` is implemented.
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
        if size <= 0:
            raise ValueError(f"{name}: size must be positive (got {size})")
        if tensor_parallel:
            raise NotImplementedError(f"{name}: tensor parallelism is not implemented in refops")
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.size = size
        self.local_size = size
        self.bias = torch.nn.Parameter(torch.empty(size, device=device, dtype=dtype))
        self._initialize_or_defer(device)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        tensor.zero_()

    def op_forward(
        self,
        ctx: OperationContext,
        input_: torch.Tensor,
        *,
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        if kwargs:
            raise TypeError(f"{type(self).__name__}: unexpected forward kwargs {sorted(kwargs)}")
        name = type(self).__name__
        bias = self.bias
        dtype = compute_dtype(name, input_, bias.dtype)
        check_tensor(name, "input", input_, dtype=bias.dtype, device=bias.device, last_dim=self.size,
                     last_dim_name="size")
        x = to_compute_dtype(input_, dtype)
        y, _ = current_backend().bias_activation_forward(x, to_compute_dtype(bias, dtype), "identity")
        ctx.dtype = dtype
        # The quantizer the grad-input leaves through (used by BackwardActivationBias).
        ctx.grad_input_quantizer = prev_op_grad_output_quantizer
        return y

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, list[Optional[torch.Tensor]]]:
        db = grad_output if grad_output.dim() == 1 else current_backend().dbias(grad_output)
        return grad_output, [db]
