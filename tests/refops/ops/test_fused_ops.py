"""Fused ops: when each applies (its conditions), and that its math equals its basic ops' composition."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops import fused
from refops.ops.fuser import OperationFuser
from refops.testing import dtype_tols

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


@pytest.fixture
def no_fusions():
    saved = [list(OperationFuser.forward_fusion_functions), list(OperationFuser.backward_fusion_functions)]
    OperationFuser.forward_fusion_functions.clear()
    OperationFuser.backward_fusion_functions.clear()
    yield
    OperationFuser.forward_fusion_functions[:] = saved[0]
    OperationFuser.backward_fusion_functions[:] = saved[1]


def _plan(model):
    fuser = model._module_groups[0]
    return [type(op).__name__ for op, _ in fuser._forward_ops], [type(op).__name__ for op, _ in fuser._backward_ops]


def _linear_bias(device, dtype):
    return te.ops.Sequential(te.ops.Linear(16, 8, device=device, dtype=dtype))


def _linear_bias_add(device, dtype):
    return te.ops.Sequential(te.ops.Linear(16, 8, device=device, dtype=dtype), te.ops.AddExtraInput(in_place=True))


def _linear_scale_add(device, dtype):
    return te.ops.Sequential(
        te.ops.Linear(16, 8, bias=False, device=device, dtype=dtype),
        te.ops.ConstantScale(0.5),
        te.ops.AddExtraInput(in_place=True),
    )


def _linear_add_backward(device, dtype):
    return te.ops.Sequential(
        te.ops.MakeExtraOutput(in_place=True), te.ops.Linear(16, 8, bias=False, device=device, dtype=dtype)
    )


def _linear_scale_backward(device, dtype):
    return te.ops.Sequential(te.ops.Linear(16, 8, bias=False, device=device, dtype=dtype), te.ops.ConstantScale(-2.5))


def _add_rmsnorm_backward(device, dtype):
    return te.ops.Sequential(te.ops.MakeExtraOutput(), te.ops.RMSNorm(16, device=device, dtype=dtype, eps=0.3))


# (builder, needs extra input, forward plan, backward plan) for bf16, where every fusion applies.
PIPELINES = {
    "linear_bias_activation": (_linear_bias, False, ["ForwardLinearBiasActivation"], ["BasicLinear", "Bias"]),
    "linear_bias_add": (_linear_bias_add, True, ["ForwardLinearBiasAdd"], ["BasicLinear", "Bias", "AddExtraInput"]),
    "linear_scale_add": (
        _linear_scale_add, True, ["ForwardLinearScaleAdd"], ["BackwardLinearScale", "AddExtraInput"],
    ),
    "linear_add_backward": (
        _linear_add_backward, False, ["MakeExtraOutput", "BasicLinear"], ["BackwardLinearAdd"],
    ),
    "linear_scale_backward": (
        _linear_scale_backward, False, ["BasicLinear", "ConstantScale"], ["BackwardLinearScale"],
    ),
    "add_rmsnorm_backward": (
        _add_rmsnorm_backward, False, ["MakeExtraOutput", "RMSNorm"], ["BackwardAddRMSNorm"],
    ),
}


def _inputs(name, device, dtype):
    x = torch.randn(4, 16, device=device, dtype=dtype)
    extra = (torch.randn(4, 8, device=device, dtype=dtype),) if PIPELINES[name][1] else ()
    return x, extra


def _run(model, x, extra):
    x = x.clone().requires_grad_()
    extra = tuple(e.clone().requires_grad_() for e in extra)
    out = model(x, *extra)
    outs = out if isinstance(out, tuple) else (out,)
    grads = [torch.linspace(-1, 1, o.numel(), device=o.device).reshape(o.shape).to(o.dtype) for o in outs]
    torch.autograd.backward(outs, grads)
    return [o.detach().clone() for o in outs], x.grad, [e.grad for e in extra]


@pytest.mark.parametrize("name", list(PIPELINES))
def test_fusion_plan(name, device):
    build, _, forward, backward = PIPELINES[name]
    model = build(device, torch.bfloat16)
    x, extra = _inputs(name, device, torch.bfloat16)
    _run(model, x, extra)
    assert _plan(model) == (forward, backward)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(PIPELINES))
def test_fused_math_equals_unfused_composition(name, dtype, device, request):
    build = PIPELINES[name][0]
    torch.manual_seed(1)
    fused_model = build(device, dtype)
    x, extra = _inputs(name, device, dtype)
    fused_out = _run(fused_model, x, extra)
    request.getfixturevalue("no_fusions")
    torch.manual_seed(1)
    plain_model = build(device, dtype)
    plain_out = _run(plain_model, x, extra)
    basic_names = [type(op).__name__ for op in plain_model._module_groups[0]._basic_ops]
    assert _plan(plain_model) == (basic_names, basic_names)  # really unfused

    def same(a, b, what):
        # Fused ops round once (fp32 intermediates, as TE's kernels), the composition after each op.
        # In fp32 they agree bit for bit, except where the scale is the GEMMs' alpha instead of scaling
        # dy first. In fp16/bf16 they differ by a few roundings of the largest intermediate (so normwise;
        # test_fused_precision.py holds each of them elementwise to float64).
        if dtype == torch.float32 and name != "linear_scale_backward":
            assert torch.equal(a, b), what
        else:
            rtol = dtype_tols(dtype)["rtol"]
            torch.testing.assert_close(a, b, rtol=rtol, atol=4 * rtol * float(b.abs().max()), msg=what)

    for a, b in zip(fused_out[0], plain_out[0]):
        same(a, b, "output")
    same(fused_out[1], plain_out[1], "dx")
    for a, b in zip(fused_out[2], plain_out[2]):
        same(a, b, "d(extra)")
    for (n, p), q in zip(fused_model.named_parameters(), plain_model.parameters()):
        same(p.grad, q.grad, n)


def test_forward_linear_bias_activation_never_fuses_fp32(device):
    model = _linear_bias(device, torch.float32)
    _run(model, *_inputs("linear_bias_activation", device, torch.float32))
    assert _plan(model)[0] == ["BasicLinear", "Bias"]


def test_out_of_place_add_does_not_fuse(device):
    model = te.ops.Sequential(te.ops.Linear(16, 8, device=device, dtype=torch.bfloat16), te.ops.AddExtraInput())
    x = torch.randn(4, 16, device=device, dtype=torch.bfloat16)
    model(x, torch.randn(4, 8, device=device, dtype=torch.bfloat16))
    assert _plan(model)[0] == ["ForwardLinearBiasActivation", "AddExtraInput"]


def test_in_place_extra_output_does_not_fuse_with_rmsnorm(device):
    model = te.ops.Sequential(te.ops.MakeExtraOutput(in_place=True), te.ops.RMSNorm(16, device=device))
    y, _ = model(torch.randn(4, 16, device=device, requires_grad=True))
    assert _plan(model)[1] == ["MakeExtraOutput", "RMSNorm"]


def test_forward_linear_bias_add_output_is_the_extra_input(device):
    model = _linear_bias_add(device, torch.bfloat16)
    x, (e,) = _inputs("linear_bias_add", device, torch.bfloat16)
    y = model(x, e)
    assert y.data_ptr() == e.data_ptr()


class _Prev(te.ops.BasicOperation):
    """An op offering a grad-output quantizer (the identity here), like a quantized BasicLinear."""

    def get_grad_output_quantizer(self):
        return lambda t: t.clone()

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer, next_op_input_quantizer):
        return input_

    def op_backward(self, ctx, grad_output):
        return grad_output, []


@pytest.mark.parametrize("act", ["GELU", "ReLU"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_backward_activation_bias_equals_composition(act, dtype, device, no_fusions):
    recipe = object()  # conditions only ask for a recipe without backward_override
    rule = fused.backward_activation_bias.RULE

    def build():
        torch.manual_seed(4)
        return te.ops.Sequential(_Prev(), te.ops.Bias(16, device=device, dtype=dtype), getattr(te.ops, act)())

    ops_list = list(build())
    assert [type(op).__name__ for op in rule.fuse(ops_list, recipe=recipe)] == ["_Prev", "BackwardActivationBias"]
    assert [type(op).__name__ for op in rule.fuse(ops_list, recipe=None)] == ["_Prev", "Bias", act]
    assert [type(op).__name__ for op in rule.fuse(ops_list[1:], recipe=recipe)] == ["Bias", act]

    x = torch.randn(3, 16, device=device, dtype=dtype)
    plain = build()
    plain_out = _run(plain, x, ())
    te.ops.register_backward_fusion(lambda ops, *, recipe: rule.fuse(ops, recipe=object()))
    fused_model = build()
    fused_out = _run(fused_model, x, ())
    assert _plan(fused_model)[1] == ["_Prev", "BackwardActivationBias"]
    assert torch.equal(fused_out[1], plain_out[1])
    assert torch.equal(fused_model[1].bias.grad, plain[1].bias.grad)


def test_rules_are_described_as_data():
    lines = [rule.describe() for rule in fused.FORWARD_RULES + fused.BACKWARD_RULES]
    assert lines[0].startswith("ForwardLinearBiasAdd: BasicLinear + Bias + AddExtraInput | BasicLinear + AddExtraInput")
    assert any("fp16 or bf16" in line for line in lines)
    assert len(lines) == 7
