"""Correct variants and planted bugs for the module tier (``compare_modules``' default ``"numerics"`` criterion).

Correct variants differ from the reference only where a correct implementation may: the order of a GEMM's sums,
one rounding instead of two (TE's fused dGELU+quantize), TF32 for fp32 GEMMs (TE's rule), a tensor core's FP8
fast accumulation, a newcomer's plain-torch FP8 Linear built right. Planted bugs are wrong. Refops variants are
backends, subclasses of the reference one overriding one kernel (``refops.kernels.register_backend``).
"""

from __future__ import annotations

import contextlib

import torch

import refops as te
from refops.kernels import ReferenceKernels, register_backend, use_backend
from refops.kernels.reference.gemm import epilogue_fp32
from refops.kernels.reference.gemm_operands import dequantize_gemm_operands
from refops.quantization.quantized_tensor import QuantizedTensor
from refops.testing.modules.twins import round_to_tf32, truncate_mantissa


def _finish(result, out, out_dtype, alpha, accumulate, bias=None):
    result = epilogue_fp32(result, alpha=alpha, out=out, accumulate=accumulate, bias=bias)
    if out is not None:
        out.copy_(result.to(out.dtype))
        return out
    return result.to(out_dtype)


class _GemmVariant(ReferenceKernels):
    def gemm(self, a, b, *, trans_a=False, trans_b=False, out_dtype, alpha=1.0, out=None, accumulate=False,
             role=None, bias=None):
        quantized = isinstance(a, QuantizedTensor) or isinstance(b, QuantizedTensor)
        qa, qb = a, b
        a, b = dequantize_gemm_operands(a, b, trans_a=trans_a, trans_b=trans_b)
        a2, b2 = (a.t() if trans_a else a), (b.t() if trans_b else b)
        result = self.product(a2, b2, quantized=quantized, operands=(qa, qb))
        return _finish(result, out, out_dtype, alpha, accumulate, bias)

    def product(self, a, b, *, quantized, operands):
        raise NotImplementedError


class SplitKGemm(_GemmVariant):
    """Correct: the GEMM split along K in two halves, the second half's sum added first."""

    name = "variant-split-k"

    def product(self, a, b, *, quantized, operands):
        a, b = a.float(), b.float()
        k = a.shape[1] // 2
        return torch.matmul(a[:, k:], b[k:]) + torch.matmul(a[:, :k], b[:k])


class Tf32Gemm(_GemmVariant):
    """Correct (TE's rule): fp32 GEMM operands rounded to TF32, round to nearest even."""

    name = "variant-tf32"

    def product(self, a, b, *, quantized, operands):
        if not quantized and a.dtype == torch.float32 and b.dtype == torch.float32:
            a, b = round_to_tf32(a), round_to_tf32(b)
        return torch.matmul(a.float(), b.float())


class FastAccumulationGemm(_GemmVariant):
    """Correct: a tensor core's FP8 fast accumulation, emulated: K in chunks of 128 whose partial sums keep 14
    mantissa bits (truncated), the chunks summed in fp32."""

    name = "variant-fp8-fast-accumulation"
    chunk, bits = 128, 14

    def product(self, a, b, *, quantized, operands):
        a, b = a.float(), b.float()
        if not quantized:
            return torch.matmul(a, b)
        total = torch.zeros(a.shape[0], b.shape[1])
        for start in range(0, a.shape[1], self.chunk):
            total = total + truncate_mantissa(torch.matmul(a[:, start:start + self.chunk], b[start:start + self.chunk]),
                                              self.bits)
        return total


class SequentialTruncationGemm(FastAccumulationGemm):
    """Correct (a cruder fast accumulation): the accumulator keeps 14 mantissa bits after each block of 4 products
    (truncated), so every quantized result is shrunk toward zero by up to K/4 truncations."""

    name = "variant-fp8-sequential-truncation"

    def product(self, a, b, *, quantized, operands):
        a, b = a.float(), b.float()
        if not quantized:
            return torch.matmul(a, b)
        total = torch.zeros(a.shape[0], b.shape[1])
        for start in range(0, a.shape[1], 4):
            total = truncate_mantissa(total + torch.matmul(a[:, start:start + 4], b[start:start + 4]), self.bits)
        return total


class OneRoundingDgelu(ReferenceKernels):
    """Correct (TE's fused dGELU+quantize): the activation's grad handed on in fp32, so the quantizer that follows
    rounds the fp32 dGELU once, where the reference rounds it to the activation dtype first."""

    name = "variant-one-rounding-dgelu"

    def activation_backward(self, grad_output, x, activation, **params):
        return super().activation_backward(grad_output.float(), x.float(), activation, **params)


class BiasOff(ReferenceKernels):
    """Bug: the bias off by a small amount (0.01) in forward."""

    name = "bug-bias-off"

    def bias_activation_forward(self, x, bias, activation, **params):
        return super().bias_activation_forward(x, None if bias is None else bias + 0.01, activation, **params)

    def gemm(self, a, b, *, bias=None, **kwargs):  # a fused Linear+Bias adds its bias in the GEMM's epilogue
        return super().gemm(a, b, bias=None if bias is None else bias + 0.01, **kwargs)


class AmaxWithoutAbs(ReferenceKernels):
    """Bug: amax = max(x), not max(|x|) (per-tensor FP8 recipes)."""

    name = "bug-amax-without-abs"

    def amax(self, x):
        return x.float().max().clamp_min(0).reshape(1) if x.numel() else torch.zeros(1)


class MissingScaleInv(_GemmVariant):
    """Bug: one GEMM (the forward one, of a per-tensor FP8 weight) forgets the weight's scale_inv."""

    name = "bug-missing-scale-inv"

    def product(self, a, b, *, quantized, operands):
        result = torch.matmul(a.float(), b.float())
        qb = operands[1]
        if isinstance(qb, QuantizedTensor) and hasattr(qb, "_scale_inv") and qb._scale_inv is not None:
            result = result / qb._scale_inv.float().reshape(-1)[0]
        return result


VARIANT_BACKENDS = {cls.name: cls for cls in (SplitKGemm, Tf32Gemm, FastAccumulationGemm, SequentialTruncationGemm,
                                               OneRoundingDgelu)}
BUG_BACKENDS = {cls.name: cls for cls in (BiasOff, AmaxWithoutAbs, MissingScaleInv)}
for _name, _cls in {**VARIANT_BACKENDS, **BUG_BACKENDS}.items():
    register_backend(_name, _cls)


def in_backend(name, recipe):
    """A context factory: backend ``name`` under refops' autocast with ``recipe``."""

    @contextlib.contextmanager
    def context():
        with use_backend(name), te.autocast(enabled=recipe is not None, recipe=recipe):
            yield

    return context


# ------------------------------------------------------------------ a newcomer's plain-torch FP8 Linear
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def current_quantize(t: torch.Tensor, fp8_dtype, *, abs_amax: bool = True) -> torch.Tensor:
    """Current scaling: scale = fmax / amax (fp32), codes = saturating RNE cast of t * scale; dequantized values."""
    fmax = torch.finfo(fp8_dtype).max
    t32 = t.float()
    amax = (t32.abs().max() if abs_amax else t32.max()).reshape(1)
    scale = torch.where(amax > 0, torch.tensor(fmax, dtype=torch.float32) / amax, torch.ones(1))
    scale_inv = 1.0 / scale
    codes = (t32 * scale).clamp(-fmax, fmax).to(fp8_dtype)
    return codes.float() * scale_inv


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, options):
        quantize_input, quantize_wgrad, abs_amax, transpose_wgrad, grad_format = options
        xq = current_quantize(x, E4M3, abs_amax=abs_amax) if quantize_input else x.float()
        wq = current_quantize(weight, E4M3, abs_amax=abs_amax)
        ctx.save_for_backward(x, xq, wq)
        ctx.options, ctx.dtype, ctx.has_bias = options, x.dtype, bias is not None
        y = (xq @ wq.t()).to(x.dtype)
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, dy):
        x, xq, wq = ctx.saved_tensors
        _, quantize_wgrad, abs_amax, transpose_wgrad, grad_format = ctx.options
        dyq = current_quantize(dy, grad_format, abs_amax=abs_amax)
        dx = (dyq @ wq).to(ctx.dtype)
        if quantize_wgrad:
            dw = dyq.t() @ xq
        else:  # the #29 newcomer: the wgrad GEMM reads the unquantized input and output grad
            dw = dy.float().t() @ x.float()
        if transpose_wgrad:
            dw = dw.t()
        db = dy.float().sum(0).to(ctx.dtype) if ctx.has_bias else None
        return dx, dw.to(ctx.dtype), db, None


class NewcomerFp8Linear(torch.nn.Module):
    """A plain-torch FP8 current-scaling Linear (E4M3 forward, E5M2 grads: HYBRID, or ``grad_format``), built from
    the recipe's text.

    Options plant bugs: ``quantize_input=False`` skips the input's quantization in forward; ``quantize_wgrad=False``
    runs the wgrad GEMM on unquantized operands (#29); ``abs_amax=False`` takes the amax without abs;
    ``transpose_wgrad=True`` hands back the weight grad transposed (square layers only).
    """

    def __init__(self, in_features, out_features, *, bias=True, dtype=torch.float32, quantize_input=True,
                 quantize_wgrad=True, abs_amax=True, transpose_wgrad=False, grad_format=E5M2):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features, dtype=dtype))
        torch.nn.init.uniform_(self.weight, -in_features ** -0.5, in_features ** -0.5)
        self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        self.options = (quantize_input, quantize_wgrad, abs_amax, transpose_wgrad, grad_format)

    def forward(self, x):
        return _Fp8LinearFunction.apply(x, self.weight, self.bias, self.options)


class TorchLinearTransposedWgrad(torch.autograd.Function):
    """Bug: a plain Linear whose weight grad is handed back transposed (square weights)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        return x @ weight.t() + bias

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        return dy @ weight, (dy.t() @ x).t(), dy.sum(0)


class TransposedWgradLinear(torch.nn.Linear):
    def forward(self, x):
        return TorchLinearTransposedWgrad.apply(x, self.weight, self.bias)


def scale_grad(module: torch.nn.Module, parameter: str, factor: float) -> torch.nn.Module:
    """Bug: the grad of ``parameter`` multiplied by ``factor`` (0: a dropped grad)."""
    def scale(p):
        p.grad.mul_(factor)

    dict(module.named_parameters())[parameter].register_post_accumulate_grad_hook(scale)
    return module
