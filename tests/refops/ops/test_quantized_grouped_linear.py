"""GroupedLinear under every recipe: per-group quantized GEMMs and quantized weights
(``docs/te-ops.md#groupedlinear-under-a-recipe``).

TE's method (``docs/te-ops.md#how-the-tests-check-an-op``), with the quantized basic-op tests' helpers
(``_quantized``): representable inputs, weights and grads, a float64 per-split ``F.linear`` reference, TE's quantization
tolerances. TE's split mix {0, 128, 256, 384}, shuffled, with G = 4 and 128 x 128 weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import refops as te
from refops.kernels import ReferenceKernels, current_backend
from refops.ops.basic.grouped_linear import GroupedLinear
from refops.ops.basic.quantize import Quantize
from refops.ops.sequential import Sequential
from refops.quantization import QuantizedTensor, QuantizerRole
from refops.testing import dtype_tols, gemm_tols

from _quantized import (
    RECIPES,
    assert_close,
    assert_exact,
    fresh_quantizer,
    make_tensors,
    make_test_recipe,
    relative_error,
    skip_unsupported,
    to64,
    tols,
)

G, IN, OUT = 4, 128, 128
SPLITS = [128, 0, 384, 256]
ROWS = sum(SPLITS)


class _SpyKernels(ReferenceKernels):
    """The reference backend, recording whether each GEMM operand was quantized."""

    name = "spy"

    def __init__(self) -> None:
        self.gemms: list[tuple[bool, bool]] = []

    def gemm(self, a, b, **kwargs):
        self.gemms.append((isinstance(a, QuantizedTensor), isinstance(b, QuantizedTensor)))
        return super().gemm(a, b, **kwargs)


def build(recipe_name, dtype, device, *, quantized_weight=False, bias=True, **kwargs) -> GroupedLinear:
    """A GroupedLinear with representable weights (quantized ones already are) and random biases."""
    with te.quantized_model_init(enabled=quantized_weight, recipe=make_test_recipe(recipe_name)):
        op = GroupedLinear(G, IN, OUT, bias=bias, device=device, dtype=dtype, **kwargs)
    with torch.no_grad():
        for name, param in op.named_parameters():
            if name.startswith("bias"):
                param.uniform_(-0.5, 0.5)
            elif not isinstance(param, QuantizedTensor):
                shape = param.shape[1:] if op.single_grouped_weight else param.shape
                for g in range(param.shape[0] if op.single_grouped_weight else 1):
                    _, w = make_tensors(shape, recipe_name, dtype, device, role="weight", low=-0.1, high=0.1)
                    (param[g] if op.single_grouped_weight else param).copy_(w)
    return op


def weight64(w: torch.Tensor, usage: str = "rowwise") -> torch.Tensor:
    """Values in float64; a quantized tensor read exactly (fp32, as the GEMM reads it), not rounded to its
    nominal dtype."""
    if isinstance(w, QuantizedTensor):
        return w.dequantize(dtype=torch.float32, usage=usage).detach().double().cpu()
    return to64(w)


def reference(op: GroupedLinear, x_ref, dy_ref):
    """float64: split the rows, ``F.linear`` each with its group's (dequantized) weight and bias, concatenate."""
    weights = [weight64(op.group_weight(g)).requires_grad_(True) for g in range(G)]
    biases = [None if op.group_bias(g) is None else to64(op.group_bias(g)).requires_grad_(True) for g in range(G)]
    y = torch.cat([F.linear(x_g, w, b) for x_g, w, b in zip(x_ref.split(SPLITS), weights, biases)])
    y.backward(dy_ref)
    return y, weights, biases


def run(op, x, dy, recipe_name, *, backend=None):
    with te.use_backend(backend or current_backend()), te.autocast(recipe=make_test_recipe(recipe_name)):
        y = op(x, torch.tensor(SPLITS))
    y.backward(dy)
    return y


def per_group_tensors(features, recipe_name, dtype, device, *, role, requires_grad):
    """Rows representable *per group* (per-tensor scales are taken per group's rows, as the op quantizes)."""
    pairs = [make_tensors((rows, features), recipe_name, dtype, device, role=role, requires_grad=False)
             for rows in SPLITS if rows]
    ref, test = torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])
    return ref.requires_grad_(requires_grad), test.requires_grad_(requires_grad)


def inputs(recipe_name, dtype, device):
    x_ref, x = per_group_tensors(IN, recipe_name, dtype, device, role="input", requires_grad=True)
    dy_ref, dy = per_group_tensors(OUT, recipe_name, dtype, device, role="grad_output", requires_grad=False)
    return x_ref, x, dy_ref, dy


@pytest.mark.parametrize("recipe_name", RECIPES)
@pytest.mark.parametrize("dtype, bias", [(torch.bfloat16, True), (torch.bfloat16, False), (torch.float32, True)],
                         ids=("bf16-bias", "bf16-no_bias", "fp32-bias"))
@pytest.mark.parametrize("quantized_weight", (False, True), ids=("hp_weight", "q_weight"))
def test_grouped_linear_quantized(recipe_name, dtype, quantized_weight, bias, device):
    skip_unsupported(recipe_name, dtype)
    op = build(recipe_name, dtype, device, quantized_weight=quantized_weight, bias=bias)
    x_ref, x, dy_ref, dy = inputs(recipe_name, dtype, device)
    spy = _SpyKernels()
    y = run(op, x, dy, recipe_name, backend=spy)
    y_ref, w_refs, b_refs = reference(op, x_ref, dy_ref)

    assert all(isinstance(op.group_weight(g), QuantizedTensor) == quantized_weight for g in range(G))
    # Every GEMM (fprop, dgrad, wgrad of the 3 non-empty groups; fprop of the empty one) read quantized data:
    # both operands, except the empty group's (0, K) rows, which stay plain.
    non_empty = sum(1 for s in SPLITS if s > 0)
    assert spy.gemms.count((True, True)) == 3 * non_empty
    assert all(b_quantized for _, b_quantized in spy.gemms[:G])  # the fprop weights
    assert not isinstance(y, QuantizedTensor) and not isinstance(x.grad, QuantizedTensor)
    assert_close(y, y_ref, **tols(recipe_name))
    if not (recipe_name == "nvfp4" and quantized_weight):  # (1D NVFP4 weights: see the exact check below)
        assert_close(x.grad, x_ref.grad, **tols(recipe_name))
    if quantized_weight:
        # The dgrad operands exactly: each stored weight's column-wise copy (its own quantization of the
        # initial values; for 1D NVFP4 it differs noticeably from the row-wise one) and Q(dy_g), read in fp32.
        w_col = [weight64(op.group_weight(g), usage="columnwise") for g in range(G)]
        dy_q = [weight64(fresh_quantizer(recipe_name, mode="backward")(dy_g)) if len(dy_g) else to64(dy_g)
                for dy_g in dy.split(SPLITS)]
        expected = torch.cat([dy_g @ w for dy_g, w in zip(dy_q, w_col)])
        assert_close(x.grad, expected, **gemm_tols(dtype))
    for g in range(G):
        grad = op.group_weight(g).grad
        assert grad is not None and not isinstance(grad, QuantizedTensor)
        if recipe_name.startswith("nvfp4") and SPLITS[g]:
            # E2M1 noise of the column-wise copies, summed over up to 384 rows: held to a relative error.
            assert relative_error(grad, w_refs[g].grad) < 0.15
        else:
            assert_close(grad, w_refs[g].grad, **tols(recipe_name))
        if bias:
            assert_close(op.group_bias(g).grad, b_refs[g].grad, **dtype_tols(dtype))


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_quantized_weights_through_meta_materialization(recipe_name, device):
    """Built on meta inside quantized_model_init: QuantizedTensor params, same objects, grads, eager values."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    recipe = make_test_recipe(recipe_name)
    _, x, _, dy = inputs(recipe_name, dtype, device)
    with te.quantized_model_init(recipe=recipe):
        torch.manual_seed(7)
        eager = GroupedLinear(G, IN, OUT, device=device, dtype=dtype)
        meta = GroupedLinear(G, IN, OUT, device="meta", dtype=dtype)
    assert all(p.is_meta for p in meta.parameters())
    ids = [id(p) for p in meta.parameters()]
    torch.manual_seed(7)
    run(meta, x, dy, recipe_name)

    assert [id(p) for p in meta.parameters()] == ids
    for (name, p), q in zip(meta.named_parameters(), eager.parameters()):
        assert not p.is_meta and p.grad is not None, name
        assert isinstance(p, QuantizedTensor) == name.startswith("weight"), name
        if isinstance(p, QuantizedTensor):  # bit-exact to eager construction
            mine, theirs = p.to_plain_tensors()[0], q.to_plain_tensors()[0]
            assert mine.keys() == theirs.keys()
            # The weight's bytes and scales; "quantizer.*" is the live recipe state (delayed scaling's scale and
            # amax), which moved on with the meta-built model's step and not with the idle eager one.
            assert all(torch.equal(mine[k], theirs[k]) for k in mine if not k.startswith("quantizer.")), name
            assert type(p.quantizer) is type(meta.get_quantizer("forward", 2 * int(name[len("weight"):]) + 1))
        else:
            assert torch.equal(p, q)


def test_quantizer_slots_and_roles(device):
    op = GroupedLinear(G, IN, OUT, device=device)
    assert op.num_quantizers("forward") == 2 * G and op.num_quantizers("backward") == G
    forward_roles = op.get_quantizer_roles("forward")
    assert [r.tensor_type for r in forward_roles] == ["input", "weight"] * G
    assert {r.module_type for r in forward_roles} == {"linear"}
    assert op.get_quantizer_roles("backward") == [QuantizerRole("linear", "grad_output", "")] * G
    assert [op._weight_quantizer_slot(f"weight{g}") for g in range(G)] == [1, 3, 5, 7]
    assert op._weight_quantizer_slot("bias0") is None
    with te.autocast(recipe=make_test_recipe("fp8_block_scaling")):
        op(torch.rand(ROWS, IN), torch.tensor(SPLITS))
    # Block scaling: weights get 128 x 128 blocks, inputs 1 x 128 (the roles at work).
    assert [op.get_quantizer("forward", i).block_scaling_dim for i in range(4)] == [1, 2, 1, 2]
    assert op.get_quantizer("forward", 0).internal and op.get_quantizer("backward", 0).internal


@pytest.mark.parametrize("recipe_name", ("fp8_current_scaling", "mxfp8", "fp8_block_scaling", "nvfp4"))
def test_backward_override_high_precision_is_the_plain_backward(recipe_name, device):
    """backward_override="high_precision": quantized forward, a backward identical to the unquantized one."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    recipe = make_test_recipe(recipe_name)
    recipe.backward_override = "high_precision"
    op = build(recipe_name, dtype, device)
    _, x, _, dy = inputs(recipe_name, dtype, device)
    spy = _SpyKernels()
    with te.use_backend(spy), te.autocast(recipe=recipe):
        y = op(x, torch.tensor(SPLITS))
    y.backward(dy)
    grads = [p.grad.clone() for p in op.parameters()]
    dx = x.grad.clone()
    x.grad = None
    op.zero_grad()
    op(x, torch.tensor(SPLITS)).backward(dy)  # no autocast

    assert all(weight_quantized for _, weight_quantized in spy.gemms[:G])  # the forward is quantized
    assert not any(q_a or q_b for q_a, q_b in spy.gemms[G:])  # the backward GEMMs are plain
    assert_exact(dx, x.grad)
    for mine, plain in zip(grads, op.parameters()):
        assert_exact(mine, plain.grad)


@pytest.mark.parametrize("recipe_name", ("fp8_current_scaling", "mxfp8", "fp8_block_scaling", "nvfp4"))
def test_backward_override_dequantized(recipe_name, device):
    """backward_override="dequantized": plain backward GEMMs on the dequantized forward operands."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    recipe = make_test_recipe(recipe_name)
    recipe.backward_override = "dequantized"
    op = build(recipe_name, dtype, device, bias=False)
    x_ref, x, dy_ref, dy = inputs(recipe_name, dtype, device)
    spy = _SpyKernels()
    with te.use_backend(spy), te.autocast(recipe=recipe):
        y = op(x, torch.tensor(SPLITS))
    y.backward(dy)

    assert not any(q_a or q_b for q_a, q_b in spy.gemms[G:])
    w_hat = [fresh_quantizer(recipe_name, role="weight")(op.group_weight(g).detach()) for g in range(G)]
    x_hat = [fresh_quantizer(recipe_name)(x_g.detach()) if len(x_g) else x_g for x_g in x.split(SPLITS)]
    expected_dx = torch.cat([dy_g.double() @ to64(w) for dy_g, w in zip(dy_ref.split(SPLITS), w_hat)])
    assert_close(x.grad, expected_dx, **gemm_tols(dtype))
    for g, (dy_g, x_g) in enumerate(zip(dy_ref.split(SPLITS), x_hat)):
        assert_close(op.group_weight(g).grad, dy_g.T @ to64(x_g), **gemm_tols(dtype))


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_single_grouped_weight_quantized_compute_matches_discrete(recipe_name, device):
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    discrete = build(recipe_name, dtype, device)
    single = GroupedLinear(G, IN, OUT, device=device, dtype=dtype, single_grouped_weight=True,
                           single_grouped_bias=True)
    with torch.no_grad():
        single.weight.copy_(torch.stack([discrete.group_weight(g) for g in range(G)]))
        single.bias.copy_(torch.stack([discrete.group_bias(g) for g in range(G)]))
    _, x, _, dy = inputs(recipe_name, dtype, device)
    x2 = x.detach().clone().requires_grad_(True)
    y_discrete, y_single = run(discrete, x, dy, recipe_name), run(single, x2, dy, recipe_name)
    assert_exact(y_single, y_discrete)
    assert_exact(x2.grad, x.grad)
    for g in range(G):
        assert_exact(single.weight.grad[g], discrete.group_weight(g).grad)
        assert_exact(single.bias.grad[g], discrete.group_bias(g).grad)


def test_single_grouped_weight_stored_quantized_is_not_implemented(device):
    with te.quantized_model_init(recipe=make_test_recipe("fp8_current_scaling")):
        with pytest.raises(NotImplementedError, match="single_grouped_weight=True with weights stored quantized"):
            GroupedLinear(G, IN, OUT, device=device, single_grouped_weight=True)
        GroupedLinear(G, IN, OUT, device=device, single_grouped_bias=True)  # a single bias is fine


@pytest.mark.parametrize("recipe_name", ("fp8_delayed_scaling", "mxfp8"))
@pytest.mark.parametrize("quantized_weight", (False, True), ids=("hp_weight", "q_weight"))
def test_delay_wgrad_compute_quantized(recipe_name, quantized_weight, device):
    """The queued quantized wgrad operands give, in backward_dw, exactly the immediate grads."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    torch.manual_seed(3)
    immediate = build(recipe_name, dtype, device, quantized_weight=quantized_weight)
    torch.manual_seed(3)
    delayed = build(recipe_name, dtype, device, quantized_weight=quantized_weight, delay_wgrad_compute=True)
    _, x, _, dy = inputs(recipe_name, dtype, device)
    run(immediate, x.detach().clone().requires_grad_(True), dy, recipe_name)
    run(delayed, x, dy, recipe_name)
    assert all(delayed.group_weight(g).grad is None for g in range(G))
    delayed.backward_dw()
    for g in range(G):
        assert_exact(delayed.group_weight(g).grad, immediate.group_weight(g).grad)


@pytest.mark.parametrize("recipe_name", RECIPES)
def test_quantized_input_is_dequantized_and_split(recipe_name, device):
    """Quantize -> GroupedLinear: the quantized input is dequantized, split and quantized per group."""
    dtype = torch.bfloat16
    skip_unsupported(recipe_name, dtype)
    op = build(recipe_name, dtype, device)
    x_ref, x, dy_ref, dy = inputs(recipe_name, dtype, device)
    with te.autocast(recipe=make_test_recipe(recipe_name)):
        y = Sequential(Quantize(), op)(x, torch.tensor(SPLITS))
    y.backward(dy)
    y_ref, _, _ = reference(op, x_ref, dy_ref)
    assert_close(y, y_ref, **tols(recipe_name))
    assert_close(x.grad, x_ref.grad, **tols(recipe_name))
