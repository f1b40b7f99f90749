"""LayerNorm and RMSNorm with quantized compute under every recipe (``docs/te-ops.md#who-quantizes-what``).

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in ``_quantized``): representable
inputs, params and grads, a float64 reference, TE's quantization tolerances; a quantizing neighbour makes the norm
emit a quantized output (TE's fused norm+cast), otherwise it stays high precision.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refops as te
from refops.ops.basic.identity import Identity
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.basic.quantize import Quantize
from refops.ops.basic.rms_norm import RMSNorm
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor
from refops.testing import make_recipe

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_close,
    assert_exact,
    fresh_quantizer,
    make_tensors,
    quantized_run,
    skip_unsupported,
    tols,
)


NORMS = {
    "layer_norm": (LayerNorm, lambda x, w, b: F.layer_norm(x, (HIDDEN,), w, b, eps=0.3)),
    "rms_norm": (RMSNorm, lambda x, w, b: x / torch.sqrt(x.square().mean(-1, keepdim=True) + 0.3) * w),
}


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("norm", list(NORMS))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("quantized_input", (False, True), ids=("hp_input", "q_input"))
def test_norm_followed_by_quantize(norm, recipe_name, dtype, quantized_input, device):
    """Quantize(fwd=quantized_input, bwd) -> norm -> Quantize: quantized in, quantized out (TE's fused norm+cast)."""
    skip_unsupported(recipe_name, dtype)
    op_class, reference = NORMS[norm]
    x_ref, x = make_tensors((2, ROWS // 2, HIDDEN), recipe_name, dtype, device, low=-1.0)
    w_ref, w = make_tensors((HIDDEN,), "fp8_current_scaling", dtype, device, low=0.5, high=1.5)
    b_ref, b = make_tensors((HIDDEN,), "fp8_current_scaling", dtype, device, low=-0.5, high=0.5)
    dy_ref, dy = make_tensors(x.shape, recipe_name, dtype, device, role="grad_output", low=-1.0,
                              requires_grad=False)
    op = op_class(HIDDEN, eps=0.3, device=device, dtype=dtype)
    with torch.no_grad():
        op.weight.copy_(w)
        if norm == "layer_norm":
            op.bias.copy_(b)
    first = Quantize(forward=quantized_input, backward=True)
    y = quantized_run(Sequential(first, op, Quantize()), x, dy, recipe_name)
    y_ref = reference(x_ref, w_ref, b_ref)
    y_ref.backward(dy_ref)

    assert isinstance(y, QuantizedTensor) and y.shape == x.shape
    assert isinstance(x.grad, QuantizedTensor)  # the norm's dx is plain; Quantize(backward) quantized it
    assert_close(y, y_ref, **tols(recipe_name))
    assert_close(x.grad, x_ref.grad, **tols(recipe_name))
    assert_close(op.weight.grad, w_ref.grad, **tols(recipe_name))
    if norm == "layer_norm":
        assert_close(op.bias.grad, b_ref.grad, **tols(recipe_name))
    if not quantized_input:  # the output is the plain norm output quantized once
        y_plain = op(x.detach())
        assert_exact(y, fresh_quantizer(recipe_name)(y_plain))


@pytest.mark.parametrize("norm", list(NORMS))
def test_norm_output_stays_high_precision_without_a_quantizing_neighbour(norm, device):
    op = NORMS[norm][0](HIDDEN, device=device)
    with te.autocast(recipe=make_recipe("fp8_current_scaling")):
        y = Sequential(op, Identity())(torch.randn(ROWS, HIDDEN, device=device))
    assert not isinstance(y, QuantizedTensor)

