"""``BackwardActivationBias``: activation backward, bias grad and quantized grad-input in one kernel."""

from __future__ import annotations

from typing import Optional

import torch

from ... import trace
from ...kernels import current_backend
from .._common import maybe_dequantize, to_compute_dtype
from ..basic.activation import GELU, ReLU
from ..basic.bias import Bias
from ..op import FusedOperation, OperationContext
from .rules import Condition, FusionRule

__all__ = ["BackwardActivationBias", "RULE"]


class BackwardActivationBias(FusedOperation):
    """Backward-only fusion of ``Bias`` + ``GELU``/``ReLU``: ``dx = act'(x) dy``, ``db = sum(dx)``.

    ``dx`` leaves quantized by the Bias context's grad-input quantizer (the
    previous op's grad-output quantizer); the fusion applies only when that
    quantizer exists, i.e. under a recipe whose backward is quantized. As TE's
    ``dbias_dact`` does, in the quantizer's one pass
    (:meth:`~refops.quantization.quantizer.Quantizer.quantize_activation_backward_dbias`):
    ``dy * act'(x)`` in fp32, quantized unrounded
    (:meth:`~refops.quantization.quantizer.Quantizer.quantize_unrounded`); ``db``
    summed from those fp32 values where the scheme's fused kernel does (delayed
    scaling, MXFP8), from the values rounded to the compute dtype otherwise
    (``docs/recipes/fused-activations.md``).
    """

    def __init__(self, *, bias: Bias, activation: GELU | ReLU) -> None:
        super().__init__([bias, activation])

    def fuser_backward(
        self,
        basic_op_ctxs: list[OperationContext],
        grad_output: torch.Tensor,
        *,
        basic_op_grad_extra_outputs: list[tuple[torch.Tensor, ...]],
    ) -> tuple[Optional[torch.Tensor], list[tuple], list[tuple[()]]]:
        bias_ctx, act_ctx = basic_op_ctxs
        activation = self.basic_ops[1]
        (act_input,) = act_ctx.saved_tensors
        if not hasattr(bias_ctx, "grad_input_quantizer"):
            raise RuntimeError(
                "BackwardActivationBias requires the previous op's grad output quantizer, "
                "but the Bias context has no quantizer"
            )
        dtype = act_ctx.dtype
        dy = to_compute_dtype(grad_output, dtype).contiguous()
        # None: the previous op runs no backward (frozen, input without grad), so dx is not quantized for it.
        quantizer = bias_ctx.grad_input_quantizer
        fused = getattr(quantizer, "quantize_activation_backward_dbias", None)
        if fused is None:  # no quantizer, or a quantizer-like callable of the user's: the unfused pass
            dx, db = current_backend().activation_backward_dbias(
                dy, act_input, activation.kernel_activation, **activation.kernel_params()
            )
            return (dx if quantizer is None else quantizer(dx)), [(db,), ()], [(), ()]
        trace.record("fused_quantize", type(self).__name__, instance=self, direction="backward",
                     quantizer=type(quantizer).__name__)
        # The scheme's one pass: dact, its quantization and the bias grad.
        x = maybe_dequantize(act_input, dtype).contiguous()
        dx, db = fused(dy, x, activation.kernel_activation, dtype=dtype, **activation.kernel_params())
        return dx, [(db,), ()], [(), ()]


RULE = FusionRule(
    fused_op=BackwardActivationBias,
    patterns=((Bias, (GELU, ReLU)),),
    conditions=(
        Condition(
            "a recipe is active and its backward is quantized (no backward_override)",
            lambda w, r, p: r is not None and getattr(r, "backward_override", None) is None,
        ),
        Condition(
            "the op before the Bias offers a grad-output quantizer",
            lambda w, r, p: p is not None and p.get_grad_output_quantizer() is not None,
        ),
    ),
    build=lambda w: BackwardActivationBias(bias=w[0], activation=w[1]),
)
