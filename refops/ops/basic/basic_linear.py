"""``BasicLinear``: ``y = x W^T``, the GEMM at the centre of every pipeline."""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, to_compute_dtype
from ..op import BasicOperation, OperationContext
from ..parameter_lifecycle import canonicalize_device, canonicalize_dtype

__all__ = ["BasicLinear"]


class BasicLinear(BasicOperation):
    """``y = x W^T`` over the last dim (any leading shape).

    Parameters: ``weight`` of shape ``(out_features, in_features)``, initialized
    with ``kaiming_uniform_(a=sqrt(5))`` like ``torch.nn.Linear``.

    Args:
        in_features, out_features: sizes of the input's and output's last dim.
        device: where the weight lives; ``"meta"`` defers allocation to the first
            forward (or an explicit ``reset_parameters()``).
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        tensor_parallel_mode, tensor_parallel_group, sequence_parallel: distributed
            options; only the single-process configuration is implemented.
        rng_state_tracker_function: returns an object whose ``fork()`` context wraps
            the weight's random initialization.
        accumulate_into_main_grad: accumulate wgrad into ``weight.main_grad``
            (which must exist) instead of returning it.
        userbuffers_options: communication overlap; not supported (must be None).
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        device: Optional[torch.device | str] = None,
        dtype: Optional[torch.dtype] = None,
        tensor_parallel_mode: Optional[str] = None,
        tensor_parallel_group: Any = None,
        sequence_parallel: bool = False,
        rng_state_tracker_function: Optional[Callable[[], Any]] = None,
        accumulate_into_main_grad: bool = False,
        userbuffers_options: Optional[dict[str, Any]] = None,
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if in_features <= 0 or out_features <= 0:
            raise ValueError(f"{name}: in_features and out_features must be positive (got {in_features}, {out_features})")
        if tensor_parallel_mode is not None or sequence_parallel:
            raise NotImplementedError(
                f"{name}: tensor parallelism (tensor_parallel_mode={tensor_parallel_mode!r}) is not implemented "
                "in refops; use tensor_parallel_mode=None"
            )
        if userbuffers_options is not None:
            raise NotImplementedError(f"{name}: userbuffers communication overlap is not implemented in refops")
        device = canonicalize_device(device)
        dtype = canonicalize_dtype(dtype, op_name=name)
        self.in_features = in_features
        self.out_features = out_features
        self.tensor_parallel_mode = tensor_parallel_mode
        self.tensor_parallel_group = tensor_parallel_group
        self.sequence_parallel = sequence_parallel
        self._rng_state_tracker_function = rng_state_tracker_function
        self._accumulate_into_main_grad = accumulate_into_main_grad
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        self._initialize_or_defer(device)

    def init_parameter(self, name: str, tensor: torch.Tensor) -> None:
        fork = (
            self._rng_state_tracker_function().fork()
            if self._rng_state_tracker_function is not None
            else contextlib.nullcontext()
        )
        with fork:
            torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5))

    # ---------------------------------------------------------------- forward
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
        weight = self.weight
        dtype = compute_dtype(name, input_, weight.dtype)
        check_tensor(name, "input", input_, dtype=weight.dtype, device=weight.device, last_dim=self.in_features)
        x = to_compute_dtype(input_, dtype).reshape(-1, self.in_features)
        w = to_compute_dtype(weight, dtype)
        y = current_backend().gemm(x, w, trans_b=True, out_dtype=dtype)

        input_requires_grad = ctx.requires_grad
        weight_requires_grad = ctx.requires_grad and weight.requires_grad
        ctx.save_for_backward(x if weight_requires_grad else None, w if input_requires_grad else None)
        ctx.dtype = dtype
        ctx.input_shape = input_.shape
        ctx.input_requires_grad = input_requires_grad
        ctx.weight_requires_grad = weight_requires_grad
        return y.reshape(*input_.shape[:-1], self.out_features)

    # --------------------------------------------------------------- backward
    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[Optional[torch.Tensor], list[Optional[torch.Tensor]]]:
        x, w = ctx.saved_tensors
        dy = grad_output.reshape(-1, self.out_features)
        dy = dy if dy.dtype == ctx.dtype else dy.to(ctx.dtype)
        kernels = current_backend()
        dx = None
        if ctx.input_requires_grad:
            dx = kernels.gemm(dy, w, out_dtype=ctx.dtype).reshape(ctx.input_shape)
        dw = None
        if ctx.weight_requires_grad:
            dw = self._weight_grad(kernels, dy, x, ctx.dtype)
        return dx, [dw]

    def _weight_grad(self, kernels, dy: torch.Tensor, x: torch.Tensor, dtype: torch.dtype) -> Optional[torch.Tensor]:
        """``dW = dy^T x``, or its accumulation into ``weight.main_grad``."""
        if not self._accumulate_into_main_grad:
            return kernels.gemm(dy, x, trans_a=True, out_dtype=dtype)
        weight = self.weight
        main_grad = getattr(weight, "main_grad", None)
        if main_grad is None:
            raise RuntimeError(
                f"{type(self).__name__} is configured with accumulate_into_main_grad=True, "
                "but weight parameter does not have a valid main_grad attribute"
            )
        overwrite = getattr(weight, "overwrite_main_grad", False)
        kernels.gemm(dy, x, trans_a=True, out_dtype=main_grad.dtype, out=main_grad, accumulate=not overwrite)
        if hasattr(weight, "grad_added_to_main_grad"):
            weight.grad_added_to_main_grad = True
            return torch.zeros_like(weight)
        return None
