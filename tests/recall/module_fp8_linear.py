"""An opaque plain-torch FP8 linear (current scaling) against ``te.ops.Linear``, and three shipped defects.

``Fp8Linear`` is what a user's own kernel looks like to the oracle: parameters named like refops',
plain tensors out, its quantization hidden. Forward quantizes the input and the weight to E4M3;
backward quantizes the output grad to E5M2 (Format.HYBRID, the recipe's default) and runs dgrad
and wgrad on the quantized operands; the bias grad is the high-precision column sum.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

import refops as te
from refops.testing import compare_modules

from .cases import RecallCase
from .quantizer_per_tensor import FLT_MAX

FEATURES_IN, FEATURES_OUT, BATCH = 64, 32, 32


def _quantize(t: torch.Tensor, fmax: float, scale: Optional[torch.Tensor] = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(FP8 data, scale_inv)``; current scaling unless a ``scale`` is imposed."""
    fp8 = torch.float8_e4m3fn if fmax == 448.0 else torch.float8_e5m2
    if scale is None:
        magnitudes = t.float().abs()
        amax = torch.where(torch.isnan(magnitudes), 0.0, magnitudes).amax().reshape(1)
        scale = torch.where((amax == 0) | torch.isinf(amax), 1.0, torch.tensor([fmax]) / amax)
        scale = torch.where(torch.isinf(scale), FLT_MAX, scale)
    return (t.float() * scale).clamp(-fmax, fmax).to(fp8), torch.reciprocal(scale)


def _dequantize(data: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    return data.float() * scale_inv


class _Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, module):
        xq, x_scale_inv = _quantize(x, 448.0, scale=module.input_scale)
        wq, w_scale_inv = _quantize(weight, 448.0)
        module.live_input_scale_inv = x_scale_inv  # what a kernel keeps in module state between calls
        ctx.save_for_backward(xq, x_scale_inv, wq, w_scale_inv)
        ctx.module, ctx.has_bias = module, bias is not None
        y = _dequantize(xq, x_scale_inv) @ _dequantize(wq, w_scale_inv).t()
        return (y if bias is None else y + bias).to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xq, x_scale_inv, wq, w_scale_inv = ctx.saved_tensors
        module = ctx.module
        if module.defect == "live_scale_inv":  # decodes the saved bytes with the scale of the LAST forward
            x_scale_inv = module.live_input_scale_inv
        stale = torch.ones(1) if module.defect == "grad_cast_with_stale_scale" else None
        dyq, dy_scale_inv = _quantize(dy, 57344.0, scale=stale)
        dy_hp = _dequantize(dyq, dy_scale_inv)
        dx = (dy_hp @ _dequantize(wq, w_scale_inv)).to(dy.dtype)
        dw = (dy_hp.t() @ _dequantize(xq, x_scale_inv)).to(dy.dtype)
        db = dy.sum(0) if ctx.has_bias else None
        return dx, dw, db, None


class Fp8Linear(torch.nn.Module):
    """``y = x W^T + b`` in FP8, the way a hand-written kernel might do it, with at most one ``defect``."""

    def __init__(self, in_features: int, out_features: int, defect: Optional[str] = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter((torch.randn(out_features, in_features) / in_features**0.5).to(dtype))
        self.bias = torch.nn.Parameter((torch.randn(out_features) * 0.1).to(dtype))
        self.defect = defect
        self.live_input_scale_inv: Optional[torch.Tensor] = None
        self.input_scale: Optional[torch.Tensor] = None  # set by a fused producer that computed the amax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.defect == "bias_dropped" else self.bias
        return _Fp8LinearFunction.apply(x, self.weight, bias, self)


def _compare(defect: Optional[str]) -> Any:
    torch.manual_seed(0)
    candidate = Fp8Linear(FEATURES_IN, FEATURES_OUT, defect)
    x = torch.randn(BATCH, FEATURES_IN)
    return compare_modules(candidate, te.ops.Linear(FEATURES_IN, FEATURES_OUT), (x,),
                           recipe=te.recipe.Float8CurrentScaling())


def _interleaved_grads_differ(defect: str) -> bool:
    """fwd1, fwd2, bwd1, bwd2 (pipeline-parallel microbatches of different magnitude): bwd1's input grad."""
    grads = []
    for d in (defect, None):
        torch.manual_seed(0)
        module = Fp8Linear(FEATURES_IN, FEATURES_OUT, d)
        x1 = torch.randn(BATCH, FEATURES_IN, requires_grad=True)
        x2 = (10 * torch.randn(BATCH, FEATURES_IN)).requires_grad_()
        y1, y2 = module(x1), module(x2)
        y1.sum().backward()
        y2.sum().backward()
        grads.append(module.weight.grad.clone())
    return not torch.equal(*grads)


def _case(name: str, url: str, summary: str, defect: str) -> RecallCase:
    shows = (lambda: _interleaved_grads_differ(defect)) if defect == "live_scale_inv" else None
    return RecallCase(name, url, "module", summary, lambda: _compare(defect), lambda: _compare(None), shows)


CASES = [
    _case("fp8_grad_cast_with_stale_scale", "https://github.com/NVIDIA/TransformerEngine/pull/2007",
          "the fused dbias+quantize kernel casts dy without computing its current-scaling amax and scale, "
          "so dy is cast with a stale scale (1.0)", "grad_cast_with_stale_scale"),
    _case("fp8_linear_bias_dropped", "https://github.com/pytorch/ao/issues/4846",
          "the FP8 linear path drops F.linear's bias: missing from the output and the autograd graph",
          "bias_dropped"),
    _case("fp8_backward_decodes_with_live_scale_inv", "https://github.com/NVIDIA/TransformerEngine/issues/657",
          "backward dequantizes the saved FP8 input with the module's current scale_inv, which a later "
          "microbatch's forward has overwritten", "live_scale_inv"),
]
