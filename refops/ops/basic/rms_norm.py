"""``RMSNorm``: divide by the root mean square over the trailing dims, then scale."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ...kernels import current_backend
from .._common import check_tensor, compute_dtype, maybe_dequantize, to_compute_dtype
from ..op import OperationContext
from .normalization import Normalization, check_normalized_dims, quantize_norm_output

__all__ = ["RMSNorm"]


class RMSNorm(Normalization):
    """``y = x / sqrt(mean(x^2) + eps) * gamma`` over the trailing ``normalized_shape`` dims.

    The mean of squares is used, not the variance (no centering). With
    ``zero_centered_gamma`` the scale is ``1 + gamma``.

    Parameter: ``weight`` (gamma) of shape ``normalized_shape``, starting at ones,
    or zeros if ``zero_centered_gamma``.

    Dtypes: computes in the ``torch.autocast`` dtype when active, else the
    weight's dtype; the output is in it and ``rstd`` is fp32.

    Backward: ``(dx, dgamma)`` from the saved ``(x, rstd)``.

    Quantization: as :class:`~refops.ops.basic.layer_norm.LayerNorm` (``y``
    leaves through the next op's FP8 / MXFP8 / FP8-block / NVFP4 input
    quantizer when there is one; quantized inputs are dequantized).

    Args:
        normalized_shape: int or tuple of ints; the input's trailing dims.
        eps: added to the mean of squares.
        device: where the weight lives; ``"meta"`` defers allocation.
        dtype: fp32, fp16 or bf16 (default: torch's default dtype).
        zero_centered_gamma: use ``1 + gamma`` as the scale.
        sm_margin: GPU multiprocessors to leave free (int, or dict per
            "forward"/"backward"/"inference"); performance only.
    """

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
        y, rstd = current_backend().rms_norm_forward(
            x,
            to_compute_dtype(weight, dtype),
            eps=self.eps,
            zero_centered_gamma=self.zero_centered_gamma,
            out_dtype=dtype,
        )
        if ctx.requires_grad:
            ctx.save_for_backward(x, rstd)
        ctx.dtype = dtype
        return quantize_norm_output(y, next_op_input_quantizer)

    def op_backward(
        self, ctx: OperationContext, grad_output: torch.Tensor
    ) -> tuple[torch.Tensor, list[Optional[torch.Tensor]]]:
        dx, dw = self._backward(ctx, grad_output, dy_dtype=ctx.dtype)
        return dx, [dw]

    def backward_fp32(self, ctx: OperationContext, grad_output: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(dx, dgamma)`` with ``dx`` still in fp32, as the kernel holds it before its one rounding.

        A fusion that adds to ``dx`` (``BackwardAddRMSNorm``) adds in fp32 and
        rounds once, as TE's ``rmsnorm_bwd_add``. ``dgamma`` is in the compute dtype.
        """
        return self._backward(ctx, grad_output, dy_dtype=torch.float32)

    def _backward(
        self, ctx: OperationContext, grad_output: torch.Tensor, *, dy_dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The backward kernel; ``dx`` comes back in ``dy_dtype`` (fp32 dy is exact: the kernel computes in fp32)."""
        x, rstd = ctx.saved_tensors
        dy = maybe_dequantize(grad_output, ctx.dtype).reshape(x.shape).to(dy_dtype)
        dx, dw = current_backend().rms_norm_backward(
            dy, x, rstd, to_compute_dtype(self.weight, ctx.dtype), zero_centered_gamma=self.zero_centered_gamma
        )
        return dx.reshape(grad_output.shape), dw.reshape(self._shape)
