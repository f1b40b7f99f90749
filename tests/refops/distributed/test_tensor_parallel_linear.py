"""Tensor-parallel ``BasicLinear``, ``Linear`` and an MLP on 2 ranks against a float64 reference (TE's method).

Every rank's outputs and gradients are compared with its slice of one single-process float64
computation over the full tensors (``_tp_reference``). All cases of a test run in one start of
the ranks.
"""

from __future__ import annotations

import pytest
import torch

import refops
from refops.testing import gemm_tols

from _tp_reference import expected, make_case, rank_device, run_case

WORLD = 2


def _run_cases(rank: int, world: int, device_type: str, cases: list[dict]) -> list[dict]:
    device = rank_device(rank, device_type)
    return [run_case(case, rank, world, device) for case in cases]


def _assert_cases(cases: list[dict], results: list[list[dict]], tols) -> None:
    for rank, per_rank in enumerate(results):
        for case, got in zip(cases, per_rank):
            want = expected(case, rank, WORLD)
            label = f"{case['kind']} mode={case['mode']} sp={case['sp']} {case['dtype']} rank {rank}"
            assert sorted(got) == sorted(want), label
            for name in want:
                assert got[name].shape == want[name].shape, f"{label}: {name} shape"
                torch.testing.assert_close(got[name], want[name], **tols(case["dtype"]), msg=lambda m: f"{label}: {name}: {m}")


@pytest.fixture
def device_type(request) -> str:
    return torch.device(request.config.getoption("--device")).type


def test_basic_linear_column_and_row_with_and_without_sequence_parallel(ranks, device_type):
    """D2: y, dx and dW of BasicLinear in fp32 for column/row x SP on/off."""
    cases = [
        make_case("basic_linear", mode, sp, torch.float32, world=WORLD, seed=10 + i)
        for i, (mode, sp) in enumerate([("column", False), ("column", True), ("row", False), ("row", True)])
    ]
    _assert_cases(cases, ranks(_run_cases, device_type, cases), gemm_tols)


def test_linear_with_bias_fp32_and_bf16(ranks, device_type):
    """D3: Linear (bias) column/row x SP in fp32 and bf16; a row bias is per rank, added before the reduction."""
    cases = [
        make_case("linear", mode, sp, dtype, world=WORLD, seed=20 + i)
        for i, (mode, sp, dtype) in enumerate(
            [(m, s, d) for d in (torch.float32, torch.bfloat16) for m in ("column", "row") for s in (False, True)]
        )
    ]
    _assert_cases(cases, ranks(_run_cases, device_type, cases), gemm_tols)


def test_mlp_column_then_row(ranks, device_type):
    """D4: GELU -> Linear(column) -> GELU -> Linear(row) -> GELU, SP on/off, after 3 steps."""
    cases = [
        make_case("mlp", None, sp, dtype, world=WORLD, seed=30 + i, steps=3)
        for i, (sp, dtype) in enumerate([(False, torch.float32), (True, torch.float32), (True, torch.bfloat16)])
    ]
    _assert_cases(cases, ranks(_run_cases, device_type, cases), gemm_tols)


def test_linear_composition_and_canonicalization(ranks):
    """Row Linear = BasicLinear + per-rank Bias + ReduceScatter/AllReduce; column Linear keeps two ops."""
    results = ranks(_compositions)
    for per_rank in results:
        assert per_rank["row_sp"] == ["BasicLinear", "Bias", "ReduceScatter"]
        assert per_rank["row"] == ["BasicLinear", "Bias", "AllReduce"]
        assert per_rank["column"] == ["BasicLinear", "Bias"]
        assert per_rank["shapes"] == [(8, 32), (8,), (32, 8), (32,)]
        assert per_rank["aliases"]
        assert per_rank["indivisible"].startswith("BasicLinear: column tensor parallelism shards out_features=33")
        assert per_rank["bias_indivisible"].startswith("Bias: tensor parallelism shards size=33")


def _compositions(rank: int, world: int) -> dict:
    def types(m):
        return [type(op).__name__ for op in m.basic_ops]

    column = refops.ops.Linear(32, 16, tensor_parallel_mode="column", device="cpu")
    row = refops.ops.Linear(16, 32, tensor_parallel_mode="row", device="cpu")
    row_sp = refops.ops.Linear(16, 32, tensor_parallel_mode="row", sequence_parallel=True, device="cpu")
    out = {"column": types(column), "row": types(row), "row_sp": types(row_sp)}
    out["shapes"] = [tuple(p.shape) for m in (column, row) for p in (m.weight, m.bias)]
    out["aliases"] = all(m.weight is m.basic_ops[0].weight and m.bias is m.basic_ops[1].bias
                         for m in (column, row, row_sp))
    try:
        refops.ops.BasicLinear(16, 33, tensor_parallel_mode="column", device="cpu")
    except ValueError as e:
        out["indivisible"] = str(e)
    try:
        refops.ops.Bias(33, tensor_parallel=True, device="cpu")
    except ValueError as e:
        out["bias_indivisible"] = str(e)
    return out


def _plan(model) -> tuple[list[str], list[str]]:
    fuser = model._module_groups[0]
    return [type(op).__name__ for op, _ in fuser._forward_ops], [type(op).__name__ for op, _ in fuser._backward_ops]


def _fusions(rank: int, world: int, device_type: str) -> dict:
    from refops.ops.fused import BackwardLinearAdd, ForwardLinearBiasActivation

    device = rank_device(rank, device_type)
    bf16 = dict(dtype=torch.bfloat16, device=device)
    out = {}
    torch.manual_seed(0)
    mlp = refops.ops.Sequential(
        refops.ops.Linear(16, 16, tensor_parallel_mode="column", sequence_parallel=True, **bf16),
        refops.ops.Linear(16, 16, tensor_parallel_mode="row", sequence_parallel=True, **bf16),
    )
    x = torch.rand(4, 16, dtype=torch.bfloat16, device=device, requires_grad=True)
    y = mlp(x)
    y.backward(torch.ones_like(y))
    out["mlp"] = _plan(mlp)
    row = refops.ops.Sequential(refops.ops.BasicLinear(16, 16, tensor_parallel_mode="row", **bf16),
                                refops.ops.Bias(16, **bf16))
    row(torch.rand(4, 8, **bf16))
    out["row_linear_bias"] = _plan(row)
    column = refops.ops.Sequential(refops.ops.MakeExtraOutput(in_place=True),
                                   refops.ops.BasicLinear(16, 16, tensor_parallel_mode="column", **bf16),
                                   refops.ops.ConstantScale(0.5))
    column(torch.rand(4, 16, **bf16))
    out["column_backward"] = _plan(column)
    refusals = {}
    try:
        ForwardLinearBiasActivation(linear=row[0], bias=row[1])
    except ValueError as e:
        refusals["forward"] = str(e)
    try:
        BackwardLinearAdd(backward_add=column[0], linear=column[1])
    except ValueError as e:
        refusals["backward"] = str(e)
    out["refusals"] = refusals
    return out


def test_fusions_carry_or_leave_tensor_parallel_comms(ranks, device_type):
    """Fused ops around comm ops: column TP fuses the forward (it carries the gather), row TP and
    column-TP backward fusions do not fire, and building them by hand is TE's refusal."""
    for got in ranks(_fusions, device_type):
        forward, backward = got["mlp"]
        assert forward == ["ForwardLinearBiasActivation", "ForwardLinearBiasActivation", "ReduceScatter"]
        assert backward == ["BasicLinear", "Bias", "BasicLinear", "Bias", "ReduceScatter"]
        assert got["row_linear_bias"][0] == ["BasicLinear", "Bias"]
        assert got["column_backward"][1] == ["MakeExtraOutput", "BasicLinear", "ConstantScale"]
        assert "not supported for a row tensor-parallel BasicLinear" in got["refusals"]["forward"]
        assert "not supported for a column tensor-parallel BasicLinear" in got["refusals"]["backward"]
