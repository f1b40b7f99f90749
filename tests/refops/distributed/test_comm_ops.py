"""The collectives refops uses (D0) and the ``AllGather`` / ``ReduceScatter`` / ``AllReduce`` ops (D1) on 2 ranks.

Exact where only data moves (gathers, identity backward); ``dtype_tols`` where a sum happens,
against float64 sums of the same values (TE's ``_test_all_*`` logic).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist

import refops
from refops.ops import collectives
from refops.quantization import MXFP8Quantizer
from refops.quantization.quantizer import DType
from refops.testing import dtype_tols

from _tp_reference import rank_device

WORLD = 2
DTYPES = (torch.float32, torch.bfloat16, torch.uint8)


@pytest.fixture
def device_type(request) -> str:
    return torch.device(request.config.getoption("--device")).type


def _rank_values(rank: int, dtype: torch.dtype, shape=(4, 6)) -> torch.Tensor:
    """Distinct small integers per rank: exact in every dtype tested, sums included."""
    return (torch.arange(shape[0] * shape[1]).reshape(shape) % 7 + 10 * rank).to(dtype)


def _collectives(rank: int, world: int, device_type: str) -> dict:
    device = rank_device(rank, device_type)
    out = {}
    for dtype in DTYPES:
        x = _rank_values(rank, dtype).to(device)
        name = str(dtype).removeprefix("torch.")
        out[f"gather_rows_{name}"] = collectives.all_gather_rows(x, None)
        out[f"gather_columns_{name}"] = collectives.all_gather_columns(x, None)
        out[f"reduce_scatter_{name}"] = collectives.reduce_scatter_along_first_dim(x, None)
        out[f"all_reduce_{name}"] = collectives.all_reduce(x, None)
        out[f"input_untouched_{name}"] = x
        maxed = x.clone()
        dist.all_reduce(maxed, op=dist.ReduceOp.MAX)
        out[f"max_{name}"] = maxed
        for api in ("all_gather_into_tensor", "all_gather_single"):
            fn = getattr(dist, api, None)
            if fn is not None:
                buf = torch.empty(world * 4, 6, dtype=dtype, device=device)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    fn(buf, x)
                out[f"{api}_{name}"] = buf
        for api in ("reduce_scatter_tensor", "reduce_scatter_single"):
            fn = getattr(dist, api, None)
            if fn is not None:
                buf = torch.empty(4 // world, 6, dtype=dtype, device=device)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", FutureWarning)
                    fn(buf, x)
                out[f"{api}_{name}"] = buf
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refops' own calls must not warn (deprecated names)
        collectives.all_gather_rows(x, None)
        collectives.reduce_scatter_along_first_dim(x, None)
    return {k: v.cpu() for k, v in out.items()}


def test_collectives_move_and_sum_exactly(ranks, device_type):
    """D0: gathers, reduce-scatters and all-reduces (SUM and MAX) in fp32, bf16 and uint8, exact."""
    results = ranks(_collectives, device_type)
    for dtype in DTYPES:
        name = str(dtype).removeprefix("torch.")
        parts = [_rank_values(r, dtype) for r in range(WORLD)]
        total = (parts[0].double() + parts[1].double()).to(dtype)
        for rank, got in enumerate(results):
            assert torch.equal(got[f"gather_rows_{name}"], torch.cat(parts, 0))
            assert torch.equal(got[f"gather_columns_{name}"], torch.cat(parts, 1))
            assert torch.equal(got[f"reduce_scatter_{name}"], total.chunk(WORLD, 0)[rank])
            assert torch.equal(got[f"all_reduce_{name}"], total)
            assert torch.equal(got[f"input_untouched_{name}"], parts[rank]), "all_reduce must not modify its input"
            assert torch.equal(got[f"max_{name}"], torch.maximum(parts[0], parts[1]))
            for api in ("all_gather_into_tensor", "all_gather_single"):
                if f"{api}_{name}" in got:
                    assert torch.equal(got[f"{api}_{name}"], torch.cat(parts, 0)), api
            for api in ("reduce_scatter_tensor", "reduce_scatter_single"):
                if f"{api}_{name}" in got:
                    assert torch.equal(got[f"{api}_{name}"], total.chunk(WORLD, 0)[rank]), api


# ----------------------------------------------------------------------- D1
def _full(seed: int, shape, dtype) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g, dtype=torch.float64).to(dtype).to(torch.float64)


def _comm_ops(rank: int, world: int, device_type: str, dtype: torch.dtype) -> dict:
    device = rank_device(rank, device_type)
    out = {}

    def run(op, x, dy):
        x = x.to(device=device, dtype=dtype).requires_grad_()
        y = op(x)
        y.backward(dy.to(device=device, dtype=dtype))
        return y.detach().cpu().double(), x.grad.cpu().double()

    # AllGather: rank r holds rows r of x; every rank's dy is its own full-size tensor.
    x = _full(1, (WORLD * 4, 8), dtype)
    out["all_gather"] = run(refops.ops.AllGather(), x.chunk(world)[rank], _full(10 + rank, (WORLD * 4, 8), dtype))
    # ReduceScatter: every rank holds a full-size x; its dy is its slice's grad.
    out["reduce_scatter"] = run(refops.ops.ReduceScatter(), _full(20 + rank, (WORLD * 4, 8), dtype),
                                _full(30 + rank, (4, 8), dtype))
    out["all_reduce"] = run(refops.ops.AllReduce(), _full(40 + rank, (4, 8), dtype), _full(50 + rank, (4, 8), dtype))
    # A quantized input is gathered in quantized form.
    q = MXFP8Quantizer(DType.kFloat8E4M3)(x.chunk(world)[rank].to(device=device, dtype=dtype).reshape(4, 8)
                                          .repeat(8, 4))
    gathered = refops.ops.AllGather()(q)
    out["quantized_type"] = type(gathered).__name__
    out["quantized_values"] = gathered.dequantize(dtype=dtype).cpu().double()
    out["quantized_shard"] = q.dequantize(dtype=dtype).cpu().double()
    try:
        refops.ops.ReduceScatter()(torch.ones(3, 2, device=device, dtype=dtype))
    except ValueError as e:
        out["indivisible"] = str(e)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_comm_ops_against_float64(ranks, device_type, dtype):
    """D1: forward and backward of the three comm ops; exact where data only moves."""
    results = ranks(_comm_ops, device_type, dtype)
    x = _full(1, (WORLD * 4, 8), dtype)
    sum_tols = dtype_tols(dtype)
    for rank, got in enumerate(results):
        y, dx = got["all_gather"]
        assert torch.equal(y, x)
        dys = [_full(10 + r, (WORLD * 4, 8), dtype) for r in range(WORLD)]
        torch.testing.assert_close(dx, sum(dys).chunk(WORLD)[rank], **sum_tols)

        y, dx = got["reduce_scatter"]
        xs = [_full(20 + r, (WORLD * 4, 8), dtype) for r in range(WORLD)]
        torch.testing.assert_close(y, sum(xs).chunk(WORLD)[rank], **sum_tols)
        assert torch.equal(dx, torch.cat([_full(30 + r, (4, 8), dtype) for r in range(WORLD)]))

        y, dx = got["all_reduce"]
        torch.testing.assert_close(y, sum(_full(40 + r, (4, 8), dtype) for r in range(WORLD)), **sum_tols)
        assert torch.equal(dx, _full(50 + rank, (4, 8), dtype)), "AllReduce's backward is the identity"

        assert got["quantized_type"] == "MXFP8Tensor"
        shards = [results[r]["quantized_shard"] for r in range(WORLD)]
        assert torch.equal(got["quantized_values"], torch.cat(shards))
        assert got["indivisible"].startswith("ReduceScatter: reduce-scatter along dim 0 needs a size divisible")


def _group_of_one(rank: int, world: int) -> dict:
    groups = [dist.new_group([r]) for r in range(world)]
    own = groups[rank]
    x = torch.randn(3, 4)
    linear = refops.ops.Linear(4, 6, tensor_parallel_mode="row", sequence_parallel=True, tensor_parallel_group=own,
                               device="cpu")
    return {
        "identity": all(torch.equal(op(x), x) for op in (refops.ops.AllGather(own), refops.ops.ReduceScatter(own),
                                                           refops.ops.AllReduce(own))),
        "linear": (linear.tensor_parallel_mode, linear.sequence_parallel, tuple(linear.weight.shape),
                   [type(op).__name__ for op in linear.basic_ops]),
    }


def test_a_group_of_one_rank_turns_communication_off(ranks):
    for got in ranks(_group_of_one):
        assert got["identity"]
        assert got["linear"] == (None, False, (6, 4), ["BasicLinear", "Bias"])
