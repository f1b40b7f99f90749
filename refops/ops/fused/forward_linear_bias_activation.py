"""``ForwardLinearBiasActivation``: the forward of ``BasicLinear`` + ``Bias`` as one op (GEMM with bias epilogue)."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..basic.basic_linear import BasicLinear
from ..basic.basic_linear_tp import refuse_tensor_parallel_mode
from ..basic.bias import Bias
from ..op import FusedOperation, OperationContext
from .one_rounding import epilogue_fp32, linear_bias_forward, linear_forward_fp32
from .rules import Condition, FusionRule

__all__ = ["ForwardLinearBiasActivation", "RULE"]


class ForwardLinearBiasActivation(FusedOperation):
    """Forward-only fusion of ``BasicLinear`` and ``Bias`` (TE's activation slot is always None).

    Contract: each basic op's context is filled exactly as its own forward would
    fill it, so the unfused backward ops run unchanged. In the reference the
    fused forward *is* that composition; a fast path may run it as one GEMM with
    a bias epilogue and is then compared within the GEMM tolerance.
    """

    def __init__(self, *, linear: BasicLinear, bias: Optional[Bias], activation: None = None) -> None:
        if activation is not None:
            raise NotImplementedError("ForwardLinearBiasActivation: a fused activation is not supported (as in TE)")
        refuse_tensor_parallel_mode(type(self).__name__, linear, "row", "a fused or quantized output")
        super().__init__([linear] if bias is None else [linear, bias])

    def fuser_forward(
        self,
        basic_op_ctxs: list[OperationContext],
        input_: torch.Tensor,
        *,
        basic_op_extra_inputs: list[tuple[torch.Tensor, ...]],
        prev_op_grad_output_quantizer: Any,
        next_op_input_quantizer: Any,
        basic_op_kwargs: list[dict[str, Any]],
    ) -> tuple[torch.Tensor, list[tuple[()]]]:
        linear = self.basic_ops[0]
        if len(self.basic_ops) == 2:  # the bias in the GEMM's epilogue, one rounding
            y = linear_bias_forward(linear, basic_op_ctxs[0], self.basic_ops[1], basic_op_ctxs[1], input_,
                                    prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
                                    kwargs=basic_op_kwargs[0])
            if y is not None:
                return y, [() for _ in self.basic_ops]
        y = linear_forward_fp32(linear, basic_op_ctxs[0], input_,
                                prev_op_grad_output_quantizer=prev_op_grad_output_quantizer, kwargs=basic_op_kwargs[0])
        dtype = basic_op_ctxs[0].dtype
        if len(self.basic_ops) == 2:  # the bias epilogue, on the fp32 accumulator
            y = epilogue_fp32(self.basic_ops[1], basic_op_ctxs[1], y, dtype=dtype,
                              prev_op_grad_output_quantizer=linear.get_grad_output_quantizer())
        y = y.to(dtype)  # the one rounding
        return y, [() for _ in self.basic_ops]


RULE = FusionRule(
    fused_op=ForwardLinearBiasActivation,
    patterns=((BasicLinear, Bias),),
    conditions=(
        Condition("the linear is not row tensor-parallel", lambda w, r, p: w[0].tensor_parallel_mode != "row"),
        Condition(
            "the weight is fp16 or bf16 (cuBLAS bias epilogue)",
            lambda w, r, p: w[0].weight.dtype in (torch.float16, torch.bfloat16),
        ),
    ),
    build=lambda w: ForwardLinearBiasActivation(linear=w[0], bias=w[1]),
)
