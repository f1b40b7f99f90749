"""Ops that pass quantized tensors through or dequantize them, under every recipe
(``docs/te-ops.md#who-quantizes-what``).

Identity, eval Dropout and MakeExtraOutput hand a QuantizedTensor on unchanged; Reshape,
ConstantScale, Dropout, L2Normalization, the norms and activations read it at its
dequantized values; AddExtraInput, MakeExtraOutput and ScaledSwiGLU with quantized
tensors. TE's method (``docs/te-ops.md#how-the-tests-check-an-op``, helpers in
``_quantized``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refops as te
from refops.ops.basic.activation import GELU
from refops.ops.basic.add_extra_input import AddExtraInput
from refops.ops.basic.constant_scale import ConstantScale
from refops.ops.basic.dropout import Dropout
from refops.ops.basic.identity import Identity
from refops.ops.basic.l2normalization import L2Normalization
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.basic.make_extra_output import MakeExtraOutput
from refops.ops.basic.quantize import Quantize
from refops.ops.basic.reshape import Reshape
from refops.ops.basic.rms_norm import RMSNorm
from refops.ops.basic.scaled_activation import ScaledSwiGLU
from refops.ops.basic.swiglu import SwiGLU
from refops.ops.op import OperationContext
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor
from refops.testing import dtype_tols

from _quantized import (
    HIDDEN,
    RECIPES,
    ROWS,
    assert_close,
    assert_exact,
    gelu_reference,
    glu_reference,
    make_tensors,
    make_test_recipe,
    quantized_run,
    record_calls,
    skip_unsupported,
    to64,
    tols,
)


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("op_name", ("identity", "dropout_eval", "make_extra_output"))
def test_pass_through_ops_keep_quantized_tensors(op_name, recipe_name, device):
    """Identity, eval Dropout and MakeExtraOutput hand a quantized tensor on unchanged, forward and backward."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    op = {"identity": Identity, "dropout_eval": lambda: Dropout(0.5).eval(), "make_extra_output": MakeExtraOutput}
    op = op[op_name]()
    _, q = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, quantized=True, requires_grad=False)
    forward = op.fuser_forward([OperationContext()], q, basic_op_extra_inputs=[()],
                               prev_op_grad_output_quantizer=None, next_op_input_quantizer=None,
                               basic_op_kwargs=[{}])
    assert forward[0] is q and all(t is q for t in forward[1][0])  # the very same object

    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device)
    dy_ref, dy = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, role="grad_output", requires_grad=False)
    model = Sequential(Quantize(forward=True, backward=False), op, Quantize(forward=False, backward=True))
    out = quantized_run(model, x, dy, recipe_name) if op_name != "make_extra_output" else None
    if out is None:
        with te.autocast(recipe=make_test_recipe(recipe_name)):
            out, extra = model(x)
        assert isinstance(extra, QuantizedTensor) and extra is out
        out.backward(dy)
    assert isinstance(out, QuantizedTensor)
    assert_exact(out, x_ref)
    # Quantized by the last Quantize and passed on (MakeExtraOutput adds autograd's zero grad of the
    # unused extra output, on dequantized values).
    assert isinstance(x.grad, QuantizedTensor) == (op_name != "make_extra_output")
    assert_exact(x.grad, dy_ref)


def _misc_cases(device, dtype):
    """name -> (op, float64 forward reference)."""
    return {
        "reshape": (Reshape((-1, HIDDEN // 2)), lambda x: x.reshape(-1, HIDDEN // 2)),
        "constant_scale": (ConstantScale(-2.5), lambda x: -2.5 * x),
        "dropout_eval": (Dropout(0.5).eval(), lambda x: x),
        "l2normalization": (L2Normalization(eps=1e-6), lambda x: x * torch.rsqrt(x.square().sum(-1, True) + 1e-6)),
        "layer_norm": (LayerNorm(HIDDEN, device=device, dtype=dtype), lambda x: F.layer_norm(x, (HIDDEN,))),
        "rms_norm": (RMSNorm(HIDDEN, device=device, dtype=dtype),
                     lambda x: x * torch.rsqrt(x.square().mean(-1, True) + 1e-5)),
        "gelu": (GELU(), gelu_reference),
        "swiglu": (SwiGLU(), glu_reference(F.silu)),
    }


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize(
    "case", ("reshape", "constant_scale", "dropout_eval", "l2normalization", "layer_norm", "rms_norm", "gelu", "swiglu")
)
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_quantized_input_and_grad_are_dequantized(case, recipe_name, dtype, device):
    """A QuantizedTensor input (and grad-output) is accepted and read at its dequantized values."""
    skip_unsupported(recipe_name, dtype)
    op, reference = _misc_cases(device, dtype)[case]
    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, low=-1.0, quantized=True)
    y_ref = reference(x_ref)
    dy_ref, dy = make_tensors(tuple(y_ref.shape), recipe_name, dtype, device, low=-1.0, requires_grad=False,
                              quantized=True)
    y = op(x)
    y.backward(dy)
    y_ref.backward(dy_ref)
    if case != "dropout_eval":  # (eval dropout passes its input on: test_pass_through_ops_keep_quantized_tensors)
        assert not isinstance(y, QuantizedTensor)
    exact = case in ("reshape", "dropout_eval")
    expected_tols = dict(rtol=0, atol=0) if exact else dtype_tols(dtype)
    assert_close(y, y_ref, **expected_tols)
    assert_close(x.grad, x_ref.grad, **expected_tols)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_dropout_training_dequantizes(recipe_name, device):
    skip_unsupported(recipe_name, torch.bfloat16)
    x_ref, x = make_tensors((ROWS, HIDDEN), recipe_name, torch.bfloat16, device, quantized=True)
    y = Dropout(0.5)(x)
    y.backward(torch.ones_like(y))
    nonzero = x_ref.detach() != 0
    kept = to64(x.grad) != 0
    assert not isinstance(y, QuantizedTensor)
    assert set(to64(x.grad).unique().tolist()) <= {0.0, 2.0}  # dx = dy * mask, mask in {0, 1/(1-p)}
    assert torch.equal(to64(y), x_ref.detach() * to64(x.grad))  # y = x * mask with the same mask
    assert torch.equal((to64(y) != 0)[nonzero], kept[nonzero])


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("in_place", (False, True))
def test_add_extra_input_and_make_extra_output(recipe_name, in_place, device):
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    x1_ref, x1 = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, quantized=True)
    x2_ref, x2 = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, quantized=True)
    dy = torch.rand(ROWS, HIDDEN, device=device, dtype=dtype)
    y = AddExtraInput(in_place=in_place)(x1, x2)
    y.backward(dy)
    if in_place:  # summed into the quantized extra input, re-quantized with its quantizer (TE: FP8 tolerance)
        assert isinstance(y, type(x2))
        assert_close(y, x1_ref + x2_ref, **tols(recipe_name))
    else:
        assert not isinstance(y, QuantizedTensor)
        assert_close(y, x1_ref + x2_ref, **dtype_tols(dtype))
    assert_exact(x1.grad, dy)
    assert_exact(x2.grad, dy)

    _, x = make_tensors((ROWS, HIDDEN), recipe_name, dtype, device, quantized=True)
    dy1, dy2 = (torch.rand(ROWS, HIDDEN, device=device, dtype=dtype) for _ in range(2))
    expected = dy1 + dy2  # (in place, the extra output's grad is accumulated into)
    y1, y2 = MakeExtraOutput(in_place=in_place)(x)
    assert_exact(y1, x)
    assert_exact(y2, x)
    torch.autograd.backward([y1, y2], [dy1, dy2])
    assert_exact(x.grad, expected)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_scaled_activation_has_no_quantizer_fusion(recipe_name, device):
    """ScaledSwiGLU between Quantize ops ignores their quantizers (as in TE): y and dx leave in high precision."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    x_ref, x = make_tensors((ROWS, 2 * HIDDEN), recipe_name, dtype, device, low=-2.0, high=2.0, quantized=True)
    scales = torch.rand(ROWS, device=device, dtype=dtype)
    dy = torch.rand(ROWS, HIDDEN, device=device, dtype=dtype)
    before, after = Quantize(forward=False, backward=True), Quantize(forward=True, backward=False)
    grads_in, outputs = [], []
    record_calls(before, "op_backward", grads_in)
    record_calls(after, "op_forward", outputs)
    y = quantized_run(Sequential(before, ScaledSwiGLU(), after), x, dy, recipe_name, scales)
    assert not isinstance(outputs[0], QuantizedTensor) and not isinstance(grads_in[0], QuantizedTensor)
    assert_close(outputs[0], glu_reference(F.silu)(x_ref) * scales.double().cpu()[:, None], **dtype_tols(dtype))
    assert isinstance(y, QuantizedTensor) and isinstance(x.grad, QuantizedTensor)  # the Quantize ops' own work
