"""``KernelBackend.gemm(..., bias=)``: the bias in the GEMM's epilogue, one rounding (issue #27).

The reference adds the bias to the fp32 result (after ``alpha`` and ``accumulate``) and rounds once, as
TE's ``general_gemm(bias=...)`` (a cuBLAS bias epilogue) does. ``ForwardLinearBiasActivation`` hands its
bias to the GEMM that way; its output must be bit for bit what it was when it added the bias to an fp32
GEMM result itself and rounded afterwards.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.kernels import get_backend
from refops.ops.fused import ForwardLinearBiasActivation
from refops.ops.fused import one_rounding
from refops.testing import make_recipe

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("trans_a,trans_b", [(False, True), (False, False), (True, False)])
def test_reference_bias_is_added_in_fp32_before_the_one_rounding(out_dtype, trans_a, trans_b):
    ref = get_backend("reference")
    g = torch.Generator().manual_seed(0)
    a = torch.randn(24, 40, generator=g).to(torch.bfloat16)
    b = torch.randn(40, 16, generator=g).to(torch.bfloat16)
    a = a.t().contiguous() if trans_a else a
    b = b.t().contiguous() if trans_b else b
    bias = (torch.randn(16, generator=g) * 3).to(torch.bfloat16)
    wide = ref.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=torch.float32, alpha=0.75)
    got = ref.gemm(a, b, trans_a=trans_a, trans_b=trans_b, out_dtype=out_dtype, alpha=0.75, bias=bias)
    assert got.dtype == out_dtype
    assert torch.equal(got, (wide + bias.float()).to(out_dtype))


def test_reference_bias_after_accumulate_into_out():
    ref = get_backend("reference")
    a, b = torch.randn(8, 32), torch.randn(16, 32)
    out = torch.randn(8, 16).to(torch.bfloat16)
    bias = torch.randn(16).to(torch.bfloat16)
    want = ((a @ b.t()) + out.float() + bias.float()).to(torch.bfloat16)
    got = ref.gemm(a, b, trans_b=True, out_dtype=torch.bfloat16, out=out.clone(), accumulate=True, bias=bias)
    assert torch.equal(got, want)


def test_reference_refuses_a_bias_of_another_size():
    with pytest.raises(ValueError, match="bias must be 1-D with 16"):
        get_backend("reference").gemm(torch.randn(8, 32), torch.randn(16, 32), trans_b=True,
                                      out_dtype=torch.float32, bias=torch.randn(15))


def _old_fused_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, prev_op_grad_output_quantizer,
                       next_op_input_quantizer, basic_op_kwargs):
    """ForwardLinearBiasActivation.fuser_forward before ``bias=``: fp32 GEMM, fp32 bias add, one rounding."""
    linear = self.basic_ops[0]
    y = one_rounding.linear_forward_fp32(linear, basic_op_ctxs[0], input_,
                                         prev_op_grad_output_quantizer=prev_op_grad_output_quantizer,
                                         kwargs=basic_op_kwargs[0])
    dtype = basic_op_ctxs[0].dtype
    if len(self.basic_ops) == 2:
        y = one_rounding.epilogue_fp32(self.basic_ops[1], basic_op_ctxs[1], y, dtype=dtype,
                                       prev_op_grad_output_quantizer=linear.get_grad_output_quantizer())
    return y.to(dtype), [() for _ in self.basic_ops]


def _step(model, x, dy, recipe_name):
    recipe = make_recipe(recipe_name) if recipe_name else None
    x = x.clone().requires_grad_()
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y = model(x)
    y.backward(dy)
    return y.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("recipe_name", [None, "fp8_delayed_scaling", "fp8_current_scaling", "fp8_block_scaling",
                                         "mxfp8", "nvfp4"])
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16))
def test_fused_linear_bias_forward_bit_identical_to_the_fp32_epilogue(recipe_name, dtype, monkeypatch, device):
    torch.manual_seed(0)
    build = lambda: te.ops.Sequential(te.ops.Linear(128, 128, dtype=dtype), te.ops.GELU(),  # noqa: E731
                                      te.ops.Linear(128, 128, dtype=dtype))
    new, old = build(), build()
    with torch.no_grad():
        for p_new, p_old in zip(new.parameters(), old.parameters()):
            p_new.copy_(torch.randn_like(p_new) * 0.1)
            p_old.copy_(p_new)
    calls = []
    real = one_rounding.linear_bias_forward

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr("refops.ops.fused.forward_linear_bias_activation.linear_bias_forward", counting)
    x, dy = torch.randn(2, 64, 128).to(dtype), torch.randn(2, 64, 128).to(dtype)
    for _ in range(2):  # delayed scaling: the second step uses updated scales
        got = _step(new, x, dy, recipe_name)
        with monkeypatch.context() as m:
            m.setattr(ForwardLinearBiasActivation, "fuser_forward", _old_fused_forward)
            want = _step(old, x, dy, recipe_name)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert got[2].keys() == want[2].keys()
        for name in got[2]:
            assert torch.equal(got[2][name], want[2][name]), name
    assert calls, "the fused op did not take the bias-epilogue path"
