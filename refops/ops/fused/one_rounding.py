"""What TE's fused kernels do with precision: keep intermediates in fp32 and round once.

A cuBLAS epilogue adds the bias, applies ``alpha`` and accumulates ``beta * C``
on the fp32 accumulator; ``rmsnorm_bwd_add`` adds the residual grad before its
store. The result is rounded to fp16/bf16 once. Running the basic ops one after
another would round after each (the unfused composition), which is why the
fusions here ask the basic ops for fp32 results and finish the sum themselves.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch

from ...quantization.quantized_tensor import QuantizedTensor
from .._common import maybe_dequantize
from ..basic.basic_linear import BasicLinear
from ..basic.bias import Bias
from ..basic.constant_scale import ConstantScale
from ..basic.rms_norm import RMSNorm
from ..op import OperationContext

__all__ = [
    "gemm_requests", "linear_forward_fp32", "linear_bias_forward", "epilogue_fp32", "backward_fp32",
    "add_grad_and_round",
]


@contextlib.contextmanager
def gemm_requests(ctx: OperationContext, *, alpha: float = 1.0, out_fp32: bool = True,
                  bias: Optional[torch.Tensor] = None) -> Iterator[None]:
    """Ask ``BasicLinear`` (through its context) for scaled and/or fp32 GEMM results, or for a bias added
    in the forward GEMM's epilogue, for one call only.

    The requests are removed afterwards, so the unfused backward that later reads
    the same context computes as usual.
    """
    ctx.gemm_alpha, ctx.gemm_out_fp32, ctx.gemm_bias = alpha, out_fp32, bias
    try:
        yield
    finally:
        del ctx.gemm_alpha, ctx.gemm_out_fp32, ctx.gemm_bias


def linear_forward_fp32(
    linear: BasicLinear, ctx: OperationContext, input_: torch.Tensor, *, prev_op_grad_output_quantizer: Any,
    kwargs: dict[str, Any],
) -> torch.Tensor:
    """``x W^T`` in fp32 (not rounded); ``ctx`` is filled exactly as the linear's own forward fills it."""
    with gemm_requests(ctx):
        return linear.op_forward(ctx, input_, prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
                                 next_op_input_quantizer=None, **kwargs)


def linear_bias_forward(
    linear: BasicLinear, linear_ctx: OperationContext, bias_op: Bias, bias_ctx: OperationContext,
    input_: torch.Tensor, *, prev_op_grad_output_quantizer: Any, kwargs: dict[str, Any],
) -> Optional[torch.Tensor]:
    """``round(x W^T + b)``: the bias added to the fp32 accumulator in the GEMM's epilogue (``bias=`` of
    ``KernelBackend.gemm``, TE's ``general_gemm(bias=...)``), one rounding to the compute dtype; both
    contexts filled as the basic ops' forwards fill them.

    The same numbers as :func:`linear_forward_fp32`, then :func:`epilogue_fp32`, then the rounding, which
    is what it replaces; None (nothing run) where the bias cannot go into the GEMM as it is (another size
    or device than the linear's output): the caller takes that path, which raises the Bias's own error.
    """
    bias = bias_op.bias
    if bias_op.local_size != linear.local_out_features or bias.device != linear.weight.device:
        return None
    gemm_bias = maybe_dequantize(bias, torch.float32) if isinstance(bias, QuantizedTensor) else bias.detach()
    with gemm_requests(linear_ctx, out_fp32=False, bias=gemm_bias):
        y = linear.op_forward(linear_ctx, input_, prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
                              next_op_input_quantizer=None, **kwargs)
    dtype = linear_ctx.dtype
    bias_op.check_input(torch.empty((), dtype=dtype, device=y.device).expand(y.shape))
    bias_ctx.dtype = dtype
    bias_ctx.grad_input_quantizer = Bias._grad_input_quantizer(bias_ctx, linear.get_grad_output_quantizer())
    return y


def epilogue_fp32(
    op: Any, ctx: OperationContext, y: torch.Tensor, *, dtype: torch.dtype, prev_op_grad_output_quantizer: Any,
) -> torch.Tensor:
    """Apply a ``Bias`` or ``ConstantScale`` to the fp32 ``y`` in fp32, filling ``ctx`` as its forward would.

    The op's input checks run against what the unfused op would have received
    (``y``'s shape, in ``dtype``), so a fusion never accepts what the composition refuses.
    """
    name = type(op).__name__
    op.check_input(torch.empty((), dtype=dtype, device=y.device).expand(y.shape))
    if isinstance(op, Bias):
        ctx.dtype = dtype
        ctx.grad_input_quantizer = Bias._grad_input_quantizer(ctx, prev_op_grad_output_quantizer)
        return y + maybe_dequantize(op.bias, torch.float32)
    if isinstance(op, ConstantScale):
        return y * op.scale
    raise TypeError(f"no fp32 epilogue for {name}")


def backward_fp32(op: Any, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, list]:
    """``(dx in fp32, param grads)`` of a ``BasicLinear`` or ``RMSNorm``, ``dx`` not yet rounded."""
    if isinstance(op, BasicLinear):
        with gemm_requests(ctx):
            dx, grads = op.op_backward(ctx, grad_output)
        return dx, grads
    if isinstance(op, RMSNorm):
        dx, dw = op.backward_fp32(ctx, grad_output)
        return dx, [dw]
    raise TypeError(f"no fp32 backward for {type(op).__name__}")


def add_grad_and_round(
    dx: Optional[torch.Tensor], grad_extra: Optional[torch.Tensor], *, dtype: torch.dtype, in_place: bool
) -> Optional[torch.Tensor]:
    """``round(dx + g)``: the extra output's grad ``g`` (None: zeros) added to the fp32 ``dx``, rounded once.

    In place (``MakeExtraOutput(in_place=True)``) the sum lands in ``g``'s memory
    (an fp16 tensor plus an fp32 one computes in fp32 and rounds once on store).
    """
    if dx is None:
        return None if grad_extra is None else maybe_dequantize(grad_extra, dtype)
    if grad_extra is None:
        return dx.to(dtype)
    if in_place and not isinstance(grad_extra, QuantizedTensor) and grad_extra.dtype == dtype:
        grad_extra += dx
        return grad_extra
    return (maybe_dequantize(grad_extra, torch.float32) + dx).to(dtype)
