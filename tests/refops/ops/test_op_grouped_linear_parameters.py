"""GroupedLinear parameters: names, order and init in both layouts, RNG forks, and deferred (meta) init."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch

from _grouped_linear_cases import (
    DTYPES,
    G,
    IN,
    OUT,
    PARAM_MODES,
    ROWS,
    bias_grad,
    make_op,
    splits,
    weight_grad,
)


# ------------------------------------------------------------------ parameters
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mode", PARAM_MODES)
def test_parameter_names_and_order(device, mode, bias):
    """The grads follow this order (``docs/te-ops.md#parameters-and-their-gradients``); refops registers single
    params at construction."""
    single_weight, single_bias = PARAM_MODES[mode]
    weights = ["weight"] if single_weight else [f"weight{g}" for g in range(G)]
    biases = (["bias"] if single_bias else [f"bias{g}" for g in range(G)]) if bias else []
    op = make_op(device, mode=mode, bias=bias)
    assert [n for n, _ in op.named_parameters()] == weights + biases
    if single_weight:
        assert op.weight.shape == (G, OUT, IN)
    if single_bias and bias:
        assert op.bias.shape == (G, OUT)


@pytest.mark.parametrize("dtype", DTYPES)
def test_init_values_and_modes_identical(device, dtype):
    """kaiming_uniform_(a=sqrt(5)) per group in group order, zero biases, identical in both layouts."""
    torch.manual_seed(3)
    discrete = make_op(device, dtype, "discrete")
    torch.manual_seed(3)
    single = make_op(device, dtype, "single")
    torch.manual_seed(3)
    expected = [torch.empty(OUT, IN, dtype=dtype) for _ in range(G)]
    for w in expected:
        torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))
    for g in range(G):
        assert torch.equal(discrete.get_parameter(f"weight{g}"), expected[g])
        assert torch.equal(single.weight[g], expected[g])
        assert torch.count_nonzero(discrete.get_parameter(f"bias{g}")) == 0
    assert torch.count_nonzero(single.bias) == 0
    assert single.weight.abs().max() <= 1 / math.sqrt(IN)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_discrete_and_single_modes_compute_identically(device, dtype):
    torch.manual_seed(5)
    ops = [make_op(device, dtype, mode, scale_bias=True) for mode in ("discrete", "single")]
    with torch.no_grad():  # same non-zero biases in both layouts
        biases = torch.randn(G, OUT, dtype=dtype)
        ops[1].bias.copy_(biases)
        for g in range(G):
            ops[0].get_parameter(f"bias{g}").copy_(biases[g])
            ops[0].get_parameter(f"weight{g}").copy_(ops[1].weight[g])
    x, scales = torch.randn(ROWS, IN, dtype=dtype), torch.rand(ROWS, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    results = []
    for op in ops:
        xi, si = x.clone().requires_grad_(), scales.clone().requires_grad_()
        y = op(xi, splits(), si)
        y.backward(dy)
        dw = torch.stack([weight_grad(op, g) for g in range(G)])
        db = torch.stack([bias_grad(op, g) for g in range(G)])
        results.append((y, xi.grad, si.grad, dw, db))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_rng_state_tracker_forks_once_per_group(device):
    class Tracker:
        forks = 0

        @contextlib.contextmanager
        def fork(self):
            Tracker.forks += 1
            yield

    for mode in ("discrete", "single"):
        Tracker.forks = 0
        op = make_op(device, mode=mode, rng_state_tracker_function=Tracker)
        assert Tracker.forks == G
        op.reset_parameters()
        assert Tracker.forks == 2 * G


# ------------------------------------------------------------------ deferred init (meta)
@pytest.mark.parametrize("input_requires_grad", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_meta_construction_matches_eager(device, mode, dtype, input_requires_grad):
    x = torch.randn(ROWS, IN, dtype=dtype)
    scales = torch.rand(ROWS, dtype=dtype)
    dy = torch.randn(ROWS, OUT, dtype=dtype)
    torch.manual_seed(7)
    eager = make_op(device, dtype, mode, scale_bias=True)
    meta = make_op("meta", dtype, mode, scale_bias=True)
    assert all(p.is_meta for p in meta.parameters())
    ids = {n: id(p) for n, p in meta.named_parameters()}
    torch.manual_seed(7)  # materialization at the first forward sees eager construction's RNG state
    outputs = []
    for op in (meta, eager):
        xi, si = x.clone().requires_grad_(input_requires_grad), scales.clone().requires_grad_()
        y = op(xi, splits(), si)
        y.backward(dy)
        outputs.append((y, si.grad, *([xi.grad] if input_requires_grad else [])))
    assert {n: id(p) for n, p in meta.named_parameters()} == ids  # same objects, same count
    for (name, p), (_, q) in zip(meta.named_parameters(), eager.named_parameters()):
        assert p.device == device and torch.equal(p, q), name
        assert torch.equal(p.grad, q.grad), name
    for a, b in zip(*outputs):
        assert torch.equal(a, b)


@pytest.mark.parametrize("mode", ["discrete", "single"])
def test_meta_requires_grad_and_attributes_survive(device, mode):
    meta = make_op("meta", mode=mode, delay_wgrad_compute=True)
    for param in meta.parameters():
        param.requires_grad_(False)
        param.custom_tag = "kept"
    meta(torch.randn(ROWS, IN), splits())
    for param in meta.parameters():
        assert not param.is_meta and not param.requires_grad and param.custom_tag == "kept"
    assert all(getattr(p, "skip_backward_post_hook", False) for n, p in meta.named_parameters() if "weight" in n)


def test_reset_parameters_twice_in_single_mode(device):
    """TE fails on the second call (weight0 is gone); refops keeps count, identity and init rule."""
    op = make_op("meta", mode="single")
    before = [id(p) for p in op.parameters()]
    op.reset_parameters()
    first = op.weight.detach().clone()
    op.reset_parameters()
    assert [id(p) for p in op.parameters()] == before
    assert op.weight.device == device and not torch.equal(op.weight, first)
    assert op.weight.abs().max() <= 1 / math.sqrt(IN)
