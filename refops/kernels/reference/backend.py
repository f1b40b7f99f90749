"""``ReferenceKernels``: the kernel interface in plain torch. This *is* the numerical spec."""

from __future__ import annotations

from typing import Any, Optional

import torch

from ..interface import KernelBackend
from . import activations as act
from . import delayed_scaling, norms, quant_float8, quant_float8_block, quant_mxfp8, quant_nvfp4
from .fused_activation import FusedActivationReference
from ..gemm_numerics import HopperGemmError, gemm_role, numerics_in_force
from ..gemm_operand import GemmOperand
from .gemm import gemm_fp32
from .gemm_hopper import hopper_fp8_gemm, round_to_tf32
from .gemm_operands import dequantize_gemm_operands, gemm_operands

__all__ = ["ReferenceKernels"]


def _round_to(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` rounded once to ``dtype`` (``x`` itself when it is already in ``dtype``: ``.to`` would
    return it too, after parsing its arguments, which costs more than the op on a small tensor)."""
    return x if x.dtype == dtype else x.to(dtype)


def _rows(x: torch.Tensor, inner: int) -> torch.Tensor:
    """View ``x`` as ``(rows, inner)`` fp32."""
    return x.reshape(-1, inner).float()


class ReferenceKernels(FusedActivationReference, KernelBackend):
    """Readable torch implementations of every kernel (see :class:`KernelBackend`); the fused activation +
    quantize methods are the compositions of :class:`FusedActivationReference`."""

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
        role: Optional[str] = None,
        bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        role = gemm_role(role, trans_a=trans_a, trans_b=trans_b)
        if numerics_in_force().name == "hopper":
            return self._gemm_hopper(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, alpha=alpha,
                                     out=out, accumulate=accumulate, role=role, bias=bias)
        a, b = dequantize_gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b)
        a2 = a.t() if trans_a else a
        b2 = b.t() if trans_b else b
        result = gemm_fp32(a2, b2, alpha=alpha, out=out, accumulate=accumulate, bias=bias)
        if out is not None:
            out.copy_(_round_to(result, out.dtype))
            return out
        return _round_to(result, out_dtype)

    def _gemm_hopper(self, a, b, *, trans_a, trans_b, out_dtype, alpha, out, accumulate, role, bias):
        """``gemm`` under ``gemm_numerics("hopper")`` (``refops.kernels.reference.gemm_hopper``)."""
        target = out.dtype if out is not None else out_dtype
        a_op, b_op = gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b, values=False)
        quantized = [isinstance(t, GemmOperand) for t in (a_op, b_op)]
        if all(quantized):
            result = hopper_fp8_gemm(a_op, b_op, role=role, target=target, alpha=alpha, out=out,
                                     accumulate=accumulate, bias=bias)
        elif any(quantized):
            raise HopperGemmError(
                "gemm_numerics('hopper'): one operand is quantized and the other is not; a tensor core multiplies "
                "two FP8 operands or two plain ones"
            )
        else:
            if a_op.dtype == torch.float32 and b_op.dtype == torch.float32:
                a_op, b_op = round_to_tf32(a_op), round_to_tf32(b_op)  # TE's fp32 GEMMs: CUBLAS_COMPUTE_32F_FAST_TF32
            a2 = a_op.t() if trans_a else a_op
            b2 = b_op.t() if trans_b else b_op
            result = _round_to(gemm_fp32(a2, b2, alpha=alpha, out=out, accumulate=accumulate, bias=bias), target)
        if out is not None:
            out.copy_(result)
            return out
        return result

    # ---------------------------------------------------------- quantization
    def amax(self, x):
        return quant_float8.amax(x)

    def delayed_scaling_update(self, amax_history, scale, amax, *, numerator, algorithm):
        delayed_scaling.delayed_scaling_update(amax_history, scale, amax, numerator=numerator, algorithm=algorithm)

    def compute_scale_from_amax(self, amax, *, fmax, force_pow_2_scales, amax_epsilon, value_for_inf):
        return quant_float8.compute_scale_from_amax(
            amax,
            fmax=fmax,
            force_pow_2_scales=force_pow_2_scales,
            amax_epsilon=amax_epsilon,
            value_for_inf=value_for_inf,
        )

    def quantize_float8(self, x, scale, *, fp8_dtype, rowwise, columnwise, amax_accumulator=None):
        return quant_float8.quantize_float8(
            x, scale, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise, amax_accumulator=amax_accumulator
        )

    def dequantize_float8(self, data, scale_inv, *, fp8_dtype, out_dtype):
        return quant_float8.dequantize_float8(data, scale_inv, fp8_dtype=fp8_dtype, out_dtype=out_dtype)

    def quantize_mxfp8(self, x, *, fp8_dtype, rowwise, columnwise, with_2d_quantization=False):
        return quant_mxfp8.quantize_mxfp8(
            x, fp8_dtype=fp8_dtype, rowwise=rowwise, columnwise=columnwise, with_2d_quantization=with_2d_quantization
        )

    def dequantize_mxfp8(self, data, scale_inv, *, fp8_dtype, columnwise, out_dtype):
        return quant_mxfp8.dequantize_mxfp8(
            data, scale_inv, fp8_dtype=fp8_dtype, columnwise=columnwise, out_dtype=out_dtype
        )

    def quantize_float8_block(
        self, x, *, fp8_dtype, rowwise, columnwise, block_scaling_dim, force_pow_2_scales, amax_epsilon
    ):
        return quant_float8_block.quantize_float8_block(
            x,
            fp8_dtype=fp8_dtype,
            rowwise=rowwise,
            columnwise=columnwise,
            block_scaling_dim=block_scaling_dim,
            force_pow_2_scales=force_pow_2_scales,
            amax_epsilon=amax_epsilon,
        )

    def dequantize_float8_block(self, data, scale_inv, *, fp8_dtype, columnwise, block_scaling_dim, out_dtype):
        return quant_float8_block.dequantize_float8_block(
            data,
            scale_inv,
            fp8_dtype=fp8_dtype,
            columnwise=columnwise,
            block_scaling_dim=block_scaling_dim,
            out_dtype=out_dtype,
        )

    def quantize_nvfp4(
        self,
        x,
        *,
        rowwise,
        columnwise,
        with_2d_quantization=False,
        with_rht=False,
        with_random_sign_mask=True,
        stochastic_rounding=False,
        random_bytes_rowwise=None,
        random_bytes_columnwise=None,
        use_4over6=False,
        e4m3_max_4over6=256.0,
        err_mode="MAE",
        row_scaled=False,
        amax_rowwise=None,
        amax_columnwise=None,
    ):
        r = quant_nvfp4.quantize_nvfp4(
            x,
            rowwise=rowwise,
            columnwise=columnwise,
            with_2d_quantization=with_2d_quantization,
            with_rht=with_rht,
            with_random_sign_mask=with_random_sign_mask,
            stochastic_rounding=stochastic_rounding,
            random_bytes_rowwise=random_bytes_rowwise,
            random_bytes_columnwise=random_bytes_columnwise,
            use_4over6=use_4over6,
            e4m3_max_4over6=e4m3_max_4over6,
            err_mode=err_mode,
            row_scaled=row_scaled,
            amax_rowwise=amax_rowwise,
            amax_columnwise=amax_columnwise,
        )
        return (r.rowwise_data, r.rowwise_scale, r.rowwise_amax, r.columnwise_data, r.columnwise_scale,
                r.columnwise_amax)

    def nvfp4_amax(self, x, *, rowwise, columnwise, with_rht=False, with_random_sign_mask=True, row_scaled=False):
        return quant_nvfp4.nvfp4_amax(x, rowwise=rowwise, columnwise=columnwise, with_rht=with_rht,
                                      with_random_sign_mask=with_random_sign_mask, row_scaled=row_scaled)

    def dequantize_nvfp4(self, data, scale_inv, amax, *, shape, columnwise, e4m3_max, out_dtype):
        return quant_nvfp4.dequantize_nvfp4(
            data, scale_inv, amax, shape=shape, columnwise=columnwise, e4m3_max=e4m3_max, out_dtype=out_dtype
        )

    # ------------------------------------------------------------ element-wise
    def activation_forward(self, x: torch.Tensor, activation: str, **params: Any) -> torch.Tensor:
        x32 = x.float()
        if act.is_gated(activation):
            y = act.gated_forward(x32, activation, **params)
        else:
            y = act.unary_forward(x32, activation)
        return _round_to(y, x.dtype)

    def activation_backward(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> torch.Tensor:
        dy32, x32 = grad_output.float(), x.float()
        if act.is_gated(activation):
            dx = act.gated_backward(dy32, x32, activation, **params)
        else:
            dx = dy32 * act.unary_derivative(x32, activation)
        return _round_to(dx, grad_output.dtype)

    def bias_activation_forward(
        self, x: torch.Tensor, bias: torch.Tensor | None, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pre = x if bias is None else _round_to(x.float() + bias.float(), x.dtype)
        return self.activation_forward(pre, activation, **params), pre

    def activation_backward_dbias(
        self, grad_output: torch.Tensor, x: torch.Tensor, activation: str, **params: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        dx = self.activation_backward(grad_output, x, activation, **params)
        return dx, self.dbias(dx)

    def dbias(self, grad_output: torch.Tensor) -> torch.Tensor:
        inner = grad_output.shape[-1]
        return _round_to(_rows(grad_output, inner).sum(dim=0), grad_output.dtype)

    # ----------------------------------------------------------- normalization
    def layer_norm_forward(self, x, weight, bias, *, eps, zero_centered_gamma, out_dtype):
        inner = weight.numel()
        y, mean, rstd = norms.layer_norm_forward(
            _rows(x, inner), weight.reshape(-1).float(), bias.reshape(-1).float(), eps, zero_centered_gamma
        )
        return _round_to(y, out_dtype).reshape(x.shape), mean, rstd

    def layer_norm_backward(self, grad_output, x, mean, rstd, weight, *, zero_centered_gamma):
        inner = weight.numel()
        dx, dw, db = norms.layer_norm_backward(
            _rows(grad_output, inner), _rows(x, inner), mean, rstd, weight.reshape(-1).float(), zero_centered_gamma
        )
        return (
            _round_to(dx, grad_output.dtype).reshape(x.shape),
            _round_to(dw, weight.dtype).reshape(weight.shape),
            _round_to(db, weight.dtype).reshape(weight.shape),
        )

    def rms_norm_forward(self, x, weight, *, eps, zero_centered_gamma, out_dtype):
        inner = weight.numel()
        y, rstd = norms.rms_norm_forward(_rows(x, inner), weight.reshape(-1).float(), eps, zero_centered_gamma)
        return _round_to(y, out_dtype).reshape(x.shape), rstd

    def rms_norm_backward(self, grad_output, x, rstd, weight, *, zero_centered_gamma):
        inner = weight.numel()
        dx, dw = norms.rms_norm_backward(
            _rows(grad_output, inner), _rows(x, inner), rstd, weight.reshape(-1).float(), zero_centered_gamma
        )
        return _round_to(dx, grad_output.dtype).reshape(x.shape), _round_to(dw, weight.dtype).reshape(weight.shape)

    def l2_normalize_forward(self, x, *, eps):
        y, r = norms.l2_normalize_forward(_rows(x, x.shape[-1]), eps)
        return _round_to(y, x.dtype).reshape(x.shape), r

    def l2_normalize_backward(self, grad_output, x, rsqrt_norm, *, eps):
        inner = x.shape[-1]
        dx = norms.l2_normalize_backward(_rows(grad_output, inner), _rows(x, inner), rsqrt_norm, eps)
        return _round_to(dx, grad_output.dtype).reshape(x.shape)
