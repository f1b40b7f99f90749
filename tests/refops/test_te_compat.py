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


# ------------------------------------------------- the names TE users reach for first (issue #29)
_AVAILABILITY_QUERIES = (
    "is_fp8_available",
    "is_mxfp8_available",
    "is_fp8_block_scaling_available",
    "is_nvfp4_available",
    "is_bf16_available",
)


@pytest.mark.parametrize("name", _AVAILABILITY_QUERIES)
def test_availability_queries_follow_te_return_conventions(name):
    """TE's tests open with ``te.is_fp8_available(return_reason=True)``; refops runs every recipe, so: yes."""
    query = getattr(te, name)
    assert name in te.__all__
    assert query() is True
    assert query(return_reason=False) is True
    assert query(return_reason=True) == (True, "")
    assert query(True) == (True, "")  # TE's parameter is positional too


@pytest.mark.parametrize(
    "name", ["check_fp8_support", "check_mxfp8_support", "check_nvfp4_support", "check_fp8_block_scaling_support"]
)
def test_check_support_functions_live_where_te_keeps_them(name):
    """TE: ``transformer_engine.pytorch.quantization.check_*_support() -> (bool, reason)``."""
    check = getattr(importlib.import_module("refops.quantization"), name)
    assert check() == (True, "")


def test_check_recipe_support_accepts_every_recipe_and_refuses_a_non_recipe():
    from refops.quantization import check_recipe_support

    for recipe in (
        refops.recipe.DelayedScaling(),
        refops.recipe.Float8CurrentScaling(),
        refops.recipe.MXFP8BlockScaling(),
        refops.recipe.Float8BlockScaling(),
        refops.recipe.NVFP4BlockScaling(),
    ):
        assert check_recipe_support(recipe) is None
    with pytest.raises(TypeError, match="check_recipe_support: expected a refops.recipe.Recipe, got str"):
        check_recipe_support("mxfp8")


def test_the_recipes_availability_admits_run_here_on_the_cpu():
    """What ``True`` promises: each recipe runs a Linear forward and backward on this (CPU) machine."""
    recipes = {
        "is_fp8_available": refops.recipe.Float8CurrentScaling(),
        "is_mxfp8_available": refops.recipe.MXFP8BlockScaling(),
        "is_fp8_block_scaling_available": refops.recipe.Float8BlockScaling(),
        "is_nvfp4_available": refops.recipe.NVFP4BlockScaling(),
    }
    for name, recipe in recipes.items():
        assert getattr(te, name)()
        model = te.ops.Linear(128, 128, device="cpu", dtype=torch.bfloat16)
        x = torch.randn(128, 128, dtype=torch.bfloat16, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = model(x)
        y.float().sum().backward()
        assert torch.isfinite(y.float()).all() and x.grad is not None, name


def test_nvfp4_quantizer_and_tensor_are_top_level_names():
    """``from transformer_engine.pytorch import NVFP4Quantizer`` (TE's test_fusible_ops.py does it)."""
    from refops import NVFP4Quantizer, NVFP4Tensor
    from refops.quantization import DType

    assert {"NVFP4Quantizer", "NVFP4Tensor"} <= set(te.__all__)
    assert NVFP4Quantizer is te.quantization.NVFP4Quantizer
    q = NVFP4Quantizer(DType.kFloat4E2M1, rowwise=True, columnwise=False)
    x = torch.randn(16, 32, dtype=torch.bfloat16)
    qx = q(x)
    assert isinstance(qx, NVFP4Tensor)
    assert qx.dequantize(dtype=torch.float32).shape == x.shape
