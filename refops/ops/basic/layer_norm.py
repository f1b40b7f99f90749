"""``LayerNorm``: normalize over the trailing dims, then scale and shift."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import OperationContext
from .normalization import Normalization, check_normalized_dims, quantize_norm_output

__all__ = ["LayerNorm"]


class LayerNorm(Normalization):
    """``y = (x - E[x]) / sqrt(Var[x] + eps) * gamma + beta`` over the trailing ``normalized_shape`` dims.

    ``Var`` is the biased (population) variance. With ``zero_centered_gamma`` the
    scale is ``1 + gamma`` instead of ``gamma``.

    Parameters (shape ``normalized_shape``): ``weight`` (gamma) starts at ones,
    or zeros if ``zero_centered_gamma``; ``bias`` (beta) starts at zeros.

    Dtypes: computes in the ``torch.autocast`` dtype when active, else the
    weight's dtype; the input and the parameters are cast to it, the output is in
    it, and the statistics are fp32.

    Backward: ``(dx, dgamma, dbeta)`` from the saved ``(x, mean, rstd)``.

    Quantization: a quantized input (or grad-output) is dequantized first. When
    the next op offers an input quantizer (inside ``refops.autocast``: a
    ``BasicLinear``, a ``Quantize``...) of an FP8, MXFP8, FP8-block or NVFP4
    scheme, ``y`` leaves quantized by it, the high-precision result quantized
    once (TE's fused norm + cast); the grad-input is always high precision.

    Args:
        normalized_shape: int or tuple of ints; the input's trailing dims.
        eps: added to the variance.
        device: where the parameters live; ``"meta"`` defers allocation.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        zero_centered_gamma: use ``1 + gamma`` as the scale.
        sm_margin: GPU multiprocessors to leave free (int, or dict per
            "forward"/"backward"/"inference"); performance only.
    """

    has_bias = True

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
        weight = self.weight
        dtype = compute_dtype(name, input_, weight.dtype)
        check_tensor(name, "input", input_, dtype=weight.dtype, device=weight.device)
        check_normalized_dims(name, input_, self._shape)
        x = maybe_dequantize(input_, dtype)
        y, mean, rstd = current_backend().layer_norm_forward(
            x,
            to_compute_dtype(weight, dtype),
            to_compute_dtype(self.bias, dtype),
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            out_dtype=dtype,
        )
        if ctx.requires_grad:
            ctx.save_for_backward(x, mean, rstd)
        ctx.dtype = dtype
        return quantize_norm_output(y, next_op_input_quantizer)

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, list[Optional[torch.Tensor]]]:
        x, mean, rstd = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, ctx.dtype).reshape(x.shape)
        dx, dw, db = current_backend().layer_norm_backward(
            dy, x, mean, rstd, to_compute_dtype(self.weight, ctx.dtype), zero_centered_gamma=self.zero_centered_gamma
        )
        return dx.reshape(grad_output.shape), [dw.reshape(self._shape), db.reshape(self._shape)]


