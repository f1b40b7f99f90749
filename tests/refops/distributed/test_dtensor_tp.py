"""DTensor tensor parallelism on refops ops (``docs/distributed.md#tensor-parallelism-with-dtensor``, case T1),
on 2 forked gloo ranks.

torch's ``ColwiseParallel``/``RowwiseParallel`` accept only ``nn.Linear``/``nn.Embedding``, so the DTensor
path for a refops ``Linear`` is ``distribute_module``: the weight is sharded (``Shard(0)``: column-wise,
``Shard(1)``: row-wise), the input is made a DTensor, and the refops ops compute on DTensors. In high
precision the output and the weight gradient equal the single-process values; under a quantization
recipe (or with quantized weights) refops refuses with an error that names its own tensor-parallel ops.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.recipe import Float8CurrentScaling

import _fsdp2_cases as C


def _single_process(seed: int):
    torch.manual_seed(seed)
    linear = te.ops.Linear(32, 64, bias=False)
    x = torch.randn(16, 32, generator=torch.Generator().manual_seed(5))
    y = linear(x)
    y.backward(torch.ones_like(y))
    return x, linear.weight.detach().clone(), y.detach(), linear.weight.grad.clone()


def _distributed(linear, mesh, weight_placement, input_placement):
    from torch.distributed.tensor import distribute_module, distribute_tensor

    def partition(name, module, device_mesh):
        # The Linear comes first: assigning its weight assigns the basic op's, and the alias follows.
        # (distribute_module replicates whatever a partition leaves plain, so the Linear cannot be skipped.)
        for pname, param in list(module._parameters.items()):
            if param is not None and type(param).__name__ != "DTensor":
                setattr(module, pname,
                        torch.nn.Parameter(distribute_tensor(param.detach(), device_mesh, [weight_placement])))

    return distribute_module(linear, mesh, partition)


def _cases(rank, world_size):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = C.mesh(world_size)
    x, weight, y_ref, dw_ref = _single_process(seed=3)
    out = {}
    for mode, weight_placement, input_placement in (("column", Shard(0), Replicate()), ("row", Shard(1), Shard(1))):
        torch.manual_seed(3)
        linear = _distributed(te.ops.Linear(32, 64, bias=False), mesh, weight_placement, input_placement)
        x_d = distribute_tensor(x, mesh, [input_placement])
        y = linear(x_d)
        y.backward(torch.ones_like(y))
        out[mode] = {
            "weight_is_dtensor": type(linear.weight).__name__ == "DTensor",
            "alias": linear.weight is linear.basic_ops[0].weight,
            "y_diff": (y.full_tensor() - y_ref).abs().max().item(),
            "dw_diff": (linear.weight.grad.full_tensor() - dw_ref).abs().max().item(),
        }
        try:
            with te.autocast(recipe=Float8CurrentScaling()):
                linear(x_d)
            out[mode]["quantized"] = "no error"
        except NotImplementedError as error:
            out[mode]["quantized"] = str(error)
    from refops.quantization.float8 import Float8CurrentScalingQuantizer
    from refops.quantization.quantizer import DType

    try:
        Float8CurrentScalingQuantizer(DType.kFloat8E4M3)(distribute_tensor(x, mesh, [Shard(0)]))
        out["quantizer_on_dtensor"] = "no error"
    except TypeError as error:
        out["quantizer_on_dtensor"] = str(error)
    return out


@pytest.fixture(scope="module")
def results(cpu_ranks):
    return cpu_ranks(_cases, timeout=120)


@pytest.mark.parametrize("mode", ["column", "row"])
def test_t1_distribute_module_on_a_high_precision_linear_matches_a_single_process(results, mode):
    for r in results:
        out = r[mode]
        assert out["weight_is_dtensor"] and out["alias"]
        # Column: each rank computes whole output columns, exactly. Row: the ranks' partial sums are added.
        assert out["y_diff"] <= (0.0 if mode == "column" else 1e-6), out
        assert out["dw_diff"] == 0.0, out


@pytest.mark.parametrize("mode", ["column", "row"])
def test_t1_quantized_dtensor_tensor_parallelism_is_a_documented_error(results, mode):
    for r in results:
        message = r[mode]["quantized"]
        assert message.startswith("Linear: its parameters ['weight'] are DTensors"), message
        assert "under Float8CurrentScaling" in message and "tensor_parallel_mode" in message
        assert "docs/tensor-parallel.md" in message


def test_a_quantizer_given_a_dtensor_is_a_clear_error(results):
    """Not an AssertionError after an implicitly replicated amax: a TypeError saying what to quantize instead."""
    for r in results:
        message = r["quantizer_on_dtensor"]
        assert message.startswith("Float8CurrentScalingQuantizer: cannot quantize a DTensor"), message
        assert "to_local()" in message and "amax_reduction_group" in message
