"""Deferred initialization: meta construction, materialization, identity, and equality with eager construction.

These are the checks TE PR #3327 added for the seed bug, extended to every
param-owning op, to requires_grad True and False, and to bit-exact equality of
parameters, outputs and grads with the same op built directly on the device.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.ops.fuser import OperationFuser

from _cases import CASE_IDS, CASES, aliases_in_sync

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _run(module: torch.nn.Module, inputs: tuple[torch.Tensor, ...], input_requires_grad: bool):
    x, *extra = inputs
    x = x.detach().clone().requires_grad_(input_requires_grad)
    y = module(x, *extra)
    y = y[0] if isinstance(y, tuple) else y
    dy = torch.arange(y.numel(), device=y.device, dtype=torch.float32).reshape(y.shape).div(y.numel()).to(y.dtype)
    y.backward(dy)
    return x, y


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_meta_construction_allocates_nothing(case, device):
    before = torch.cuda.memory_allocated() if device.type == "cuda" else None
    module = case.build("meta", torch.float32)
    params = list(module.parameters())
    assert params, "the case must own parameters"
    assert all(p.is_meta for p in params)
    if before is not None:
        assert torch.cuda.memory_allocated() == before


@pytest.mark.parametrize("input_requires_grad", [True, False], ids=["x_grad", "x_no_grad"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_first_forward_materializes_like_eager(case, dtype, input_requires_grad, device):
    inputs = case.inputs(device, dtype)
    torch.manual_seed(7)
    eager = case.build(device, dtype)
    meta = case.build("meta", dtype)
    ids = {name: id(p) for name, p in meta.named_parameters()}
    torch.manual_seed(7)
    x_meta, y_meta = _run(meta, inputs, input_requires_grad)
    x_eager, y_eager = _run(eager, inputs, input_requires_grad)

    assert {name: id(p) for name, p in meta.named_parameters()} == ids, "materialization replaced a parameter"
    assert aliases_in_sync(meta)
    meta_params, eager_params = dict(meta.named_parameters()), dict(eager.named_parameters())
    assert meta_params.keys() == eager_params.keys()
    for name, p in meta_params.items():
        assert p.device == device, f"{name} was not materialized on {device}"
        assert p.grad is not None and p.grad.device == device, f"{name} did not get a grad on {device}"
        assert torch.equal(p, eager_params[name]), f"{name} differs from eager construction"
        assert torch.equal(p.grad, eager_params[name].grad), f"grad of {name} differs from eager construction"
    assert torch.equal(y_meta, y_eager)
    assert (x_meta.grad is not None) == input_requires_grad
    if input_requires_grad:
        assert torch.equal(x_meta.grad, x_eager.grad)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_explicit_reset_parameters_materializes_like_eager(case, device):
    torch.manual_seed(3)
    eager = case.build(device, torch.float32)
    meta = case.build("meta", torch.float32)
    ids = [id(p) for p in meta.parameters()]
    torch.manual_seed(3)
    meta.reset_parameters()
    assert [id(p) for p in meta.parameters()] == ids
    assert aliases_in_sync(meta)
    for (name, p), q in zip(meta.named_parameters(), eager.parameters()):
        assert p.device == device and torch.equal(p, q), name
    inputs = case.inputs(device, torch.float32)
    _, y_meta = _run(meta, inputs, True)
    _, y_eager = _run(eager, inputs, True)
    assert torch.equal(y_meta, y_eager)


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_to_empty_then_reset_parameters(case, device):
    torch.manual_seed(5)
    eager = case.build(device, torch.float32)
    meta = case.build("meta", torch.float32)
    meta.to_empty(device=device)
    assert aliases_in_sync(meta)
    torch.manual_seed(5)
    meta.reset_parameters()
    for p, q in zip(meta.parameters(), eager.parameters()):
        assert torch.equal(p, q)
    assert len(list(meta.parameters())) == len({id(p) for p in meta.parameters()})


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_requires_grad_set_on_meta_survives(case, device):
    meta = case.build("meta", torch.float32)
    # Freeze every parameter of the first param-owning basic op (GroupedLinear requires
    # all its weights to agree on requires_grad).
    owner = next(m for m in meta.modules() if isinstance(m, te.ops.BasicOperation) and list(m.parameters(False)))
    frozen = {id(p): p for p in owner.parameters(recurse=False)}
    for p in frozen.values():
        p.requires_grad_(False)
        p.tag = "kept"
    x, _ = _run(meta, case.inputs(device, torch.float32), True)
    for name, p in meta.named_parameters():
        if id(p) in frozen:
            assert p is frozen[id(p)] and not p.requires_grad and p.tag == "kept", name
            assert p.grad is None, name
        else:
            assert p.grad is not None, name
    assert x.grad is not None


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_first_forward_under_inference_mode_gives_trainable_parameters(case, device):
    meta = case.build("meta", torch.float32)
    inputs = case.inputs(device, torch.float32)
    with torch.inference_mode():
        meta(*inputs)
    assert not any(p.is_inference() for p in meta.parameters())
    _run(meta, inputs, True)
    assert all(p.grad is not None for p in meta.parameters())


def test_optimizer_built_before_first_forward_trains_like_eager(device):
    def build(dev):
        return te.ops.Sequential(
            te.ops.Linear(16, 32, device=dev),
            te.ops.Linear(32, 8, device=dev),
            te.ops.basic.Bias(8, device=dev),
        )

    torch.manual_seed(11)
    eager = build(device)
    meta = build("meta")
    opt_eager = torch.optim.Adam(eager.parameters(), lr=1e-2)
    opt_meta = torch.optim.Adam(meta.parameters(), lr=1e-2)
    xs = [torch.randn(6, 16, device=device) for _ in range(5)]
    torch.manual_seed(11)
    for x in xs:
        for model, opt in ((meta, opt_meta), (eager, opt_eager)):
            opt.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            opt.step()
        for p, q in zip(meta.parameters(), eager.parameters()):
            assert torch.equal(p, q)
    assert all(p.device == device for p in meta.parameters())
    # The optimizer holds exactly the live parameters.
    held = {id(p) for group in opt_meta.param_groups for p in group["params"]}
    assert held == {id(p) for p in meta.parameters()}


def test_trace_records_the_corrected_first_forward_order(device):
    model = te.ops.Sequential(te.ops.Linear(8, 4, device="meta"))
    with te.trace() as t:
        model(torch.randn(2, 8, device=device))
    kinds = [e.kind for e in t.events]
    order = ["recipe_state", "first_forward_hook", "materialize", "cache_refresh", "backward_selection", "fusion_plan"]
    positions = [kinds.index(k) for k in order]
    assert positions == sorted(positions), kinds
    materialized = t.of_kind("materialize")
    assert {e.subject for e in materialized} == {"BasicLinear.weight", "Bias.bias"}
    assert all(e.details["kept_identity"] for e in materialized)


def test_materialization_device_is_remembered_at_construction(device):
    with torch.device(device):
        op = te.ops.Linear(4, 4, device="meta")
    op(torch.randn(2, 4, device=device))
    assert op.weight.device == device


def test_meta_default_device_defers_the_target_to_materialization_time(device):
    with torch.device("meta"):
        op = te.ops.basic.BasicLinear(4, 4)
        with pytest.raises(RuntimeError, match="default device is meta"):
            op.reset_parameters()
    assert op.weight.is_meta
    op.reset_parameters()  # torch's default device is now the test device
    assert op.weight.device == device


def test_standalone_call_builds_a_fresh_fuser_each_time(device):
    op = te.ops.Linear(4, 3, device="meta")
    x = torch.randn(2, 4, device=device, requires_grad=True)
    op(x).sum().backward()
    op(x).sum().backward()
    assert op.weight.grad is not None and op.weight.device == device


def test_fuser_passes_current_parameters_to_autograd(device):
    op = te.ops.basic.BasicLinear(4, 3, device="meta")
    fuser = OperationFuser([op])
    fuser(torch.randn(2, 4, device=device))
    assert fuser._flat_basic_op_params[0] is op.weight
    assert fuser._basic_op_num_params == [1]
