"""``ReferenceKernels``: the kernel interface in plain torch. This *is* the numerical spec."""

from __future__ import annotations

from typing import Any

import torch

from ..interface import KernelBackend
from . import activations as act
from . import norms
from .gemm import gemm_fp32

__all__ = ["ReferenceKernels"]


def _rows(x: torch.Tensor, inner: int) -> torch.Tensor:
    """View ``x`` as ``(rows, inner)`` fp32."""
    return x.reshape(-1, inner).float()


class ReferenceKernels(KernelBackend):
    """Readable torch implementations of every kernel (see :class:`KernelBackend`)."""

    name = "reference"

    # ------------------------------------------------------------------ GEMM
    def gemm(
        self,
        a: torch.Tensor,
        b: torch.Tensor,
        *,
        trans_a: bool = False,
        trans_b: bool = False,
        out_dtype: torch.dtype,
        alpha: float = 1.0,
        out: torch.Tensor | None = None,
        accumulate: bool = False,
    ) -> torch.Tensor:
        a2 = a.t() if trans_a else a
        b2 = b.t() if trans_b else b
        result = gemm_fp32(a2, b2, alpha=alpha, out=out, accumulate=accumulate)
        if out is not None:
            out.copy_(result.to(out.dtype))
            return out
        return result.to(out_dtype)

    # ------------------------------------------------------------ element-wise
    def activation_forward(self, x: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
        x32 = x.float()
        if act.is_gated(activation):
            y = act.gated_forward(x32, activation, **params)
        else:
            y = act.unary_forward(x32, activation)
        return y.to(x.dtype)

    def activation_backward(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> torch.Tensor:
        dy32, x32 = grad_output.float(), x.float()
        if act.is_gated(activation):
            dx = act.gated_backward(dy32, x32, activation, **params)
        else:
            dx = dy32 * act.unary_derivative(x32, activation)
        return dx.to(grad_output.dtype)

    def bias_activation_forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pre = x if bias is None else (x.float() + bias.float()).to(x.dtype)
        return self.activation_forward(pre, activation, **params), pre

    def activation_backward_dbias(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dx = self.activation_backward(grad_output, x, activation, **params)
        return dx, self.dbias(dx)

    def dbias(self, grad_output: torch.Tensor) -> torch.Tensor:
        inner = grad_output.shape[-1]
        return _rows(grad_output, inner).sum(dim=0).to(grad_output.dtype)

    # ----------------------------------------------------------- normalization
    def layer_norm_forward(self, x, weight, bias, *, eps, zero_centered_gamma, out_dtype):
        inner = weight.numel()
        y, mean, rstd = norms.layer_norm_forward(
            _rows(x, inner), weight.reshape(-1).float(), bias.reshape(-1).float(), eps, zero_centered_gamma
        )
        return y.to(out_dtype).reshape(x.shape), mean, rstd

    def layer_norm_backward(self, grad_output, x, mean, rstd, weight, *, zero_centered_gamma):
        inner = weight.numel()
        dx, dw, db = norms.layer_norm_backward(
            _rows(grad_output, inner), _rows(x, inner), mean, rstd, weight.reshape(-1).float(), zero_centered_gamma
        )
        return (
            dx.to(grad_output.dtype).reshape(x.shape),
            dw.to(weight.dtype).reshape(weight.shape),
            db.to(weight.dtype).reshape(weight.shape),
        )

    def rms_norm_forward(self, x, weight, *, eps, zero_centered_gamma, out_dtype):
        inner = weight.numel()
        y, rstd = norms.rms_norm_forward(_rows(x, inner), weight.reshape(-1).float(), eps, zero_centered_gamma)
        return y.to(out_dtype).reshape(x.shape), rstd

    def rms_norm_backward(self, grad_output, x, rstd, weight, *, zero_centered_gamma):
        inner = weight.numel()
        dx, dw = norms.rms_norm_backward(
            _rows(grad_output, inner), _rows(x, inner), rstd, weight.reshape(-1).float(), zero_centered_gamma
        )
        return dx.to(grad_output.dtype).reshape(x.shape), dw.to(weight.dtype).reshape(weight.shape)

    def l2_normalize_forward(self, x, *, eps):
        y, r = norms.l2_normalize_forward(_rows(x, x.shape[-1]), eps)
        return y.to(x.dtype).reshape(x.shape), r

    def l2_normalize_backward(self, grad_output, x, rsqrt_norm, *, eps):
        inner = x.shape[-1]
        dx = norms.l2_normalize_backward(_rows(grad_output, inner), _rows(x, inner), rsqrt_norm, eps)
        return dx.to(grad_output.dtype).reshape(x.shape)
