"""The fuser's algorithm: backward selection, fusion passes, custom ops, the Sequential container."""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops import BasicOperation, FusedOperation
from refops.ops.basic.basic_linear import BasicLinear
from refops.ops.basic.bias import Bias
from refops.ops.fuser import OperationFuser


@pytest.fixture
def isolated_registries():
    """Custom fusions registered by a test are removed afterwards."""
    saved = [
        list(OperationFuser.forward_backward_fusion_functions),
        list(OperationFuser.forward_fusion_functions),
        list(OperationFuser.backward_fusion_functions),
    ]
    yield
    OperationFuser.forward_backward_fusion_functions[:] = saved[0]
    OperationFuser.forward_fusion_functions[:] = saved[1]
    OperationFuser.backward_fusion_functions[:] = saved[2]


class Scale(BasicOperation):
    """A user-defined basic op with one learnable scalar: y = s * x."""

    def __init__(self, device=None):
        super().__init__()
        self.s = torch.nn.Parameter(torch.empty((), device=device))
        self._initialize_or_defer(torch.device(device) if device is not None else torch.get_default_device())

    def init_parameter(self, name, tensor):
        tensor.fill_(1.5)

    def op_forward(self, ctx, input_, *, prev_op_grad_output_quantizer, next_op_input_quantizer):
        ctx.save_for_backward(input_)
        return self.s * input_

    def op_backward(self, ctx, grad_output):
        (x,) = ctx.saved_tensors
        return self.s * grad_output, [(grad_output * x).sum()]


def _selection(model, x, extra=()):
    model(x, *extra)
    return model._module_groups[0].first_op_requiring_backward


def test_first_op_requiring_backward_rules(device):
    def build():
        return te.ops.Sequential(Bias(4, device=device), Bias(4, device=device), Bias(4, device=device))

    x = torch.randn(2, 4, device=device)
    assert _selection(build(), x.clone().requires_grad_()) == 0
    model = build()
    model[0].bias.requires_grad_(False)
    assert _selection(model, x) == 1
    for p in model.parameters():
        p.requires_grad_(False)
    assert _selection(model, x) == 3
    assert not model(x).requires_grad
    model = build()
    with torch.no_grad():
        assert _selection(model, x.clone().requires_grad_()) == 3


def test_backward_stops_at_the_first_op_not_requiring_grad(device):
    model = te.ops.Sequential(BasicLinear(4, 4, device=device), BasicLinear(4, 4, device=device))
    model[0].weight.requires_grad_(False)
    x = torch.randn(2, 4, device=device)
    with te.trace(kinds=["backward_op"]) as t:
        model(x).sum().backward()
    assert [e.subject for e in t.events] == ["BasicLinear"]  # op 0 never ran backward
    assert model[0].weight.grad is None and model[1].weight.grad is not None


def test_custom_basic_op_in_sequential(device):
    op = Scale(device=device)
    model = te.ops.Sequential(te.ops.Identity(), op, te.ops.Identity())
    x = torch.randn(3, 5, device=device, requires_grad=True)
    y = model(x)
    dy = torch.randn_like(y)
    y.backward(dy)
    assert torch.equal(y, 1.5 * x)
    assert torch.equal(x.grad, 1.5 * dy)
    assert torch.allclose(op.s.grad, (dy * x).sum())


def test_custom_op_built_on_meta_materializes(device):
    op = Scale(device="meta")
    x = torch.randn(3, device=device)
    assert torch.equal(op(x), 1.5 * x)
    assert op.s.device == device


class _ScaleThenBias(FusedOperation):
    """A forward-only fusion of Scale + Bias that fills each basic ctx like the unfused forward."""

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, prev_op_grad_output_quantizer,
                      next_op_input_quantizer, basic_op_kwargs):
        scale, bias = self.basic_ops
        basic_op_ctxs[0].save_for_backward(input_)
        basic_op_ctxs[1].dtype = input_.dtype
        return scale.s * input_ + bias.bias, [(), ()]


def _fuse_scale_bias(ops, *, recipe):
    out, i = [], 0
    while i < len(ops):
        if i + 1 < len(ops) and isinstance(ops[i], Scale) and isinstance(ops[i + 1], Bias):
            out.append(_ScaleThenBias([ops[i], ops[i + 1]]))
            i += 2
        else:
            out.append(ops[i])
            i += 1
    return out


def test_registered_forward_fusion_is_used_and_backward_stays_unfused(device, isolated_registries):
    te.ops.register_forward_fusion(_fuse_scale_bias)
    model = te.ops.Sequential(Scale(device=device), Bias(4, device=device))
    x = torch.randn(2, 4, device=device, requires_grad=True)
    y = model(x)
    y.sum().backward()
    fuser = model._module_groups[0]
    assert [type(op) for op, _ in fuser._forward_ops] == [_ScaleThenBias]
    assert [idx for _, idx in fuser._forward_ops] == [[0, 1]]
    assert [type(op) for op, _ in fuser._backward_ops] == [Scale, Bias]
    assert torch.equal(y, 1.5 * x.detach())
    assert torch.equal(x.grad, torch.full_like(x, 1.5))


def test_joint_fusion_is_the_same_object_in_both_passes(device, isolated_registries):
    class Joint(_ScaleThenBias):
        def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
            (x,) = basic_op_ctxs[0].saved_tensors
            s = self.basic_ops[0].s
            return s * grad_output, [[(grad_output * x).sum()], [grad_output.sum(0)]], [(), ()]

    def fuse(ops, *, recipe):
        return [Joint(ops)] if len(ops) == 2 else ops

    te.ops.register_forward_backward_fusion(fuse, prepend=True)
    model = te.ops.Sequential(Scale(device=device), Bias(4, device=device))
    x = torch.randn(2, 4, device=device, requires_grad=True)
    model(x).sum().backward()
    fuser = model._module_groups[0]
    assert fuser._forward_ops[0][0] is fuser._backward_ops[0][0]
    assert torch.equal(model[1].bias.grad, torch.full((4,), 2.0, device=device))


def test_fusion_that_breaks_basic_op_order_is_rejected(device, isolated_registries):
    te.ops.register_forward_fusion(lambda ops, *, recipe: list(reversed(ops)))
    model = te.ops.Sequential(Bias(4, device=device), Scale(device=device))
    with pytest.raises(RuntimeError, match="Found mismatch after fusing operations"):
        model(torch.randn(2, 4, device=device))


def test_wrong_number_of_param_grads_is_reported(device):
    class Broken(Scale):
        def op_backward(self, ctx, grad_output):
            return grad_output, [None, None]

    x = torch.randn(3, device=device, requires_grad=True)
    with pytest.raises(RuntimeError, match="Expected op 0 to generate 1 param grads, but got 2"):
        Broken(device=device)(x).sum().backward()


def test_fusion_reruns_only_when_its_inputs_change(device):
    model = te.ops.Sequential(BasicLinear(4, 4, device=device))
    x = torch.randn(2, 4, device=device)
    with te.trace(kinds=["fusion_plan"]) as t:
        model(x)
        model(x)
        with torch.no_grad():
            model(x)
    assert len(t.events) == 2  # first forward, then the switch to no-grad


def test_module_groups(device):
    mods = [
        Bias(4, device=device), Bias(4, device=device), torch.nn.Identity(), torch.nn.Identity(),
        Bias(4, device=device), torch.nn.Identity(), Bias(4, device=device), Bias(4, device=device),
        Bias(4, device=device),
    ]
    model = te.ops.Sequential(*mods)
    model(torch.randn(2, 4, device=device))
    groups = model._module_groups
    assert len(groups) == 6
    assert [len(g._basic_ops) if isinstance(g, OperationFuser) else None for g in groups] == [2, None, None, 1, None, 3]
    model.append(Bias(4, device=device))
    assert model._module_groups is None


def test_sequential_list_api():
    a, b, c, d = (torch.nn.Identity() for _ in range(4))
    seq = te.ops.Sequential(a, b)
    assert len(seq) == 2 and list(seq) == [a, b] and seq[-1] is b
    seq.append(c)
    seq.extend([d])
    assert list(seq) == [a, b, c, d]
    assert list(seq[1:3]) == [b, c] and isinstance(seq[1:3], te.ops.Sequential)
    seq[0] = d
    assert seq[0] is d
    del seq[0]
    assert list(seq) == [b, c, d]
    seq.insert(1, a)
    assert list(seq) == [b, a, c, d]
    assert seq.pop(0) is b and list(seq) == [a, c, d]
    both = seq + te.ops.Sequential(b)
    assert list(both) == [a, c, d, b]
    seq += te.ops.Sequential(b)
    assert list(seq) == [a, c, d, b]
    with pytest.raises(IndexError, match="Attempted to access index 9, but there are 4 entries"):
        seq[9]
    named = te.ops.Sequential({"first": a, "second": b})
    assert dict(named.named_children()) == {"first": a, "second": b}
