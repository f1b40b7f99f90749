"""TE compatibility: the names and contracts TE code and TE's tests rely on."""

from __future__ import annotations

import importlib

import pytest
import torch

import refops as te
import refops.recipe
from refops.ops.fuser import OperationFuser


def test_quantize_is_exported_from_ops():
    assert "Quantize" in te.ops.__all__ and "Quantize" in te.ops.basic.__all__
    assert te.ops.Quantize is te.ops.basic.Quantize
    op = te.ops.Quantize(forward=True, backward=True)
    assert isinstance(op, te.ops.BasicOperation)
    x = torch.randn(4, 32)
    assert torch.equal(op(x), x)  # outside autocast: the identity


def test_common_recipe_is_importable_like_transformer_engine_common_recipe():
    common_recipe = importlib.import_module("refops.common.recipe")
    from refops.common import recipe as via_package
    from refops.common.recipe import DelayedScaling, Format

    assert via_package is common_recipe is te.common.recipe
    assert common_recipe.__all__ == refops.recipe.__all__
    for name in refops.recipe.__all__:  # the same objects, so isinstance and predicates agree
        assert getattr(common_recipe, name) is getattr(refops.recipe, name), name
    recipe = DelayedScaling(fp8_format=Format.E4M3)
    assert isinstance(recipe, refops.recipe.Recipe) and recipe.delayed()
    with te.autocast(recipe=recipe):
        te.ops.Linear(16, 16)(torch.randn(4, 16))


class _ForwardLinearSiLU(te.ops.FusedOperation):
    """TE's test_custom_forward_fused_op2 pattern: a forward-only Linear + SiLU computed by hand, filling
    each basic op's context for the unfused backward with exactly the attributes TE's test sets."""

    def __init__(self, linear, silu):
        super().__init__((linear, silu))

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, prev_op_grad_output_quantizer,
                      next_op_input_quantizer, basic_op_kwargs):
        linear, _ = self.basic_ops
        linear_ctx, silu_ctx = basic_op_ctxs
        w = linear.weight
        x = input_
        y = x @ w.t()
        z = torch.nn.functional.silu(y)
        linear_ctx.save_for_backward(x, w)
        linear_ctx.with_quantized_compute = False
        linear_ctx.input_quantizer = None
        linear_ctx.weight_quantizer = None
        linear_ctx.grad_output_quantizer = None
        linear_ctx.grad_input_quantizer = None
        linear_ctx.dtype = w.dtype
        linear_ctx.input_requires_grad = True
        linear_ctx.weight_requires_grad = True
        silu_ctx.save_for_backward(y)
        silu_ctx.dtype = w.dtype
        silu_ctx.prev_op_grad_output_quantizer = None
        return z, [(), ()]


def _fuse_linear_silu(ops, **_):
    out, i = [], 0
    while i < len(ops):
        if (i + 1 < len(ops) and isinstance(ops[i], te.ops.BasicLinear) and isinstance(ops[i + 1], te.ops.SiLU)):
            out.append(_ForwardLinearSiLU(ops[i], ops[i + 1]))
            i += 2
        else:
            out.append(ops[i])
            i += 1
    return out


@pytest.fixture
def linear_silu_fusion():
    saved = list(OperationFuser.forward_fusion_functions)
    te.ops.register_forward_fusion(_fuse_linear_silu, prepend=True)
    yield
    OperationFuser.forward_fusion_functions[:] = saved


def test_custom_fused_op_runs_basic_linear_backward_without_input_shape(linear_silu_fusion):
    torch.manual_seed(0)
    model = te.ops.Sequential(te.ops.BasicLinear(16, 8), te.ops.SiLU())
    x = torch.randn(2, 3, 16, requires_grad=True)  # a leading shape the backward must restore
    z = model(x)
    forward_ops = [type(op).__name__ for op, _ in model._module_groups[0]._forward_ops]
    assert forward_ops == ["_ForwardLinearSiLU"]
    dz = torch.randn_like(z)
    z.backward(dz)

    x_ref = x.detach().double().requires_grad_()
    w_ref = model[0].weight.detach().double().requires_grad_()
    torch.nn.functional.silu(x_ref @ w_ref.t()).backward(dz.double())
    assert x.grad.shape == x.shape
    torch.testing.assert_close(x.grad, x_ref.grad.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(model[0].weight.grad, w_ref.grad.float(), rtol=1e-5, atol=1e-6)
