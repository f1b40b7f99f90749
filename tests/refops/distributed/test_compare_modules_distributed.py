"""``compare_modules`` on distributed models (#40 item 10): FSDP2-sharded refops MLPs (plain and FP8 current
scaling weights) and tensor-parallel ones built with ``dist.group.WORLD``, each against an identically
distributed reference, on 2 gloo ranks. Every rank judges its own run (its inputs, the full parameter grads)
against a single-process float64 twin of the same parameters; a planted bug fails on the ranks where it shows.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
import torch.distributed as dist

import refops as te
from refops.recipe import Float8CurrentScaling
from refops.testing import compare_modules

FEATURES, HIDDEN, BATCH = 32, 64, 16


def _mlp(seed: int, recipe: Any = None, **linear: Any) -> te.ops.Sequential:
    torch.manual_seed(seed)
    column = dict(linear, tensor_parallel_mode="column") if linear else {}
    row = dict(linear, tensor_parallel_mode="row") if linear else {}
    with te.quantized_model_init(enabled=recipe is not None, recipe=recipe):
        return te.ops.Sequential(te.ops.Linear(FEATURES, HIDDEN, **column), te.ops.GELU(),
                                 te.ops.Linear(HIDDEN, FEATURES, **row))


def _sharded(seed: int, world: int, recipe: Any = None) -> te.ops.Sequential:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    return fully_shard(_mlp(seed, recipe), mesh=init_device_mesh("cpu", (world,)))


def _rank_input(rank: int) -> torch.Tensor:
    return torch.randn(BATCH, FEATURES, generator=torch.Generator().manual_seed(100 + rank))


def _summary(report: Any) -> dict[str, Any]:
    """What a rank sends back: the verdict, the failed tensors, and how close the reference was to float64."""
    values = [c for c in report.comparisons if c.kind == "value" and c.reference_to_float64_db is not None]
    return {"ok": report.ok, "failed": sorted({c.name for c in report.failures}),
            "failed_steps": sorted({c.scenario for c in report.failures}),
            "reference_to_float64_db": min(c.reference_to_float64_db for c in values),
            "tiers_ran": sorted(t.tier for t in report.tiers if t.ran)}


class _DoubleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y):  # noqa: D102 - the planted bug: the output's grad doubled on the way back
        return y.view_as(y)

    @staticmethod
    def backward(ctx, dy):  # noqa: D102
        return 2 * dy


# ------------------------------------------------------------------ FSDP2
def fsdp_pair(rank: int, world: int, recipe_name: Optional[str], bug: str) -> dict[str, Any]:
    recipe = Float8CurrentScaling() if recipe_name == "fp8_current" else None
    copy_parameters = bug != "weight shard perturbed"
    candidate = _sharded(0, world, recipe)
    reference = _sharded(0 if not copy_parameters else 7, world, recipe)  # its values are the candidate's
    if bug == "grad doubled on rank 0" and rank == 0:
        candidate.register_forward_hook(lambda module, args, y: _DoubleGrad.apply(y))
    if bug == "output offset on rank 0" and rank == 0:
        candidate.register_forward_hook(lambda module, args, y: y + 0.05)
    if bug == "weight shard perturbed" and rank == 0:
        with torch.no_grad():
            candidate[2].weight.to_local()[0, 0] += 0.5
    report = compare_modules(candidate, reference, (_rank_input(rank),), recipe=recipe,
                             copy_parameters=copy_parameters)
    summary = _summary(report)
    summary["sharded"] = type(candidate[0].weight).__name__, type(candidate[0].weight.to_local()).__name__
    return summary


def test_fsdp2_plain_weights_agree_on_every_rank(cpu_ranks):
    for rank, result in enumerate(cpu_ranks(fsdp_pair, None, "none")):
        assert result["ok"], (rank, result)
        assert result["sharded"] == ("DTensor", "Tensor")
        # The twins are right: the reference's full grads are those of one float64 process (FSDP2's mean).
        assert result["reference_to_float64_db"] > 100, (rank, result)
        assert "numerics" in result["tiers_ran"]


def test_fsdp2_fp8_current_scaling_weights_agree_on_every_rank(cpu_ranks):
    for rank, result in enumerate(cpu_ranks(fsdp_pair, "fp8_current", "none")):
        assert result["ok"], (rank, result)
        assert result["sharded"] == ("DTensor", "Float8Tensor")
        # FP8 round-trips cost the worst tensor some 14 dB; a twin that diverged (grads not reduced as FSDP2
        # reduces them) would be near 0 dB.
        assert result["reference_to_float64_db"] > 10, (rank, result)
        assert {"bytes (exact)", "numerics"} <= set(result["tiers_ran"])


def test_fsdp2_grad_doubled_on_one_rank_fails_where_it_shows(cpu_ranks):
    rank0, rank1 = cpu_ranks(fsdp_pair, None, "grad doubled on rank 0")
    assert not rank0["ok"] and "input[0].grad" in rank0["failed"] and "output" not in rank0["failed"], rank0
    # FSDP2 averages the parameter grads over the ranks: rank 1's full grads carry rank 0's doubled share,
    # while its own input grads are right.
    assert not rank1["ok"] and "2.bias.grad" in rank1["failed"] and "input[0].grad" not in rank1["failed"], rank1


def test_fsdp2_quantized_output_offset_on_one_rank_fails_there_only(cpu_ranks):
    rank0, rank1 = cpu_ranks(fsdp_pair, "fp8_current", "output offset on rank 0")
    assert not rank0["ok"] and "output" in rank0["failed"], rank0
    assert rank1["ok"], rank1


def test_fsdp2_weight_shard_perturbed_on_one_rank_fails_on_every_rank(cpu_ranks):
    # Without copy_parameters both sides keep their own (identically seeded) values: rank 0's changed shard is
    # part of the full weight every rank's forward all-gathers.
    for rank, result in enumerate(cpu_ranks(fsdp_pair, None, "weight shard perturbed")):
        assert not result["ok"] and "output" in result["failed"], (rank, result)


# ------------------------------------------------------------------ tensor parallelism
def tp_pair(rank: int, world: int, recipe_name: Optional[str], bug: str) -> dict[str, Any]:
    recipe = Float8CurrentScaling() if recipe_name == "fp8_current" else None
    tp = dict(tensor_parallel_group=dist.group.WORLD, sequence_parallel=True)
    candidate, reference = _mlp(rank, None, **tp), _mlp(10 + rank, None, **tp)
    if bug == "row bias grad doubled on rank 1" and rank == 1:
        candidate[2].bias.register_hook(lambda g: 2 * g)
    # "one step" and "grad scales" only: an SGD step with rank 1's wrong bias grad would change the row
    # output (the sum of the ranks' biases) on rank 0 too.
    scenarios = ("one step", "grad scales") if bug != "none" else ("one step", "grad scales", "training")
    report = compare_modules(candidate, reference, (_rank_input(rank),), recipe=recipe, scenarios=scenarios)
    return _summary(report)


def test_tensor_parallel_world_group_agrees_on_every_rank(cpu_ranks):
    for recipe_name in (None, "fp8_current"):
        for rank, result in enumerate(cpu_ranks(tp_pair, recipe_name, "none")):
            assert result["ok"], (recipe_name, rank, result)
            # FP8 round-trips of a 2^-24 output grad cost some 14 dB; a twin that diverged would be near 0 dB.
            assert result["reference_to_float64_db"] > (100 if recipe_name is None else 10), (rank, result)


def test_tensor_parallel_bias_grad_doubled_on_one_rank_fails_there(cpu_ranks):
    rank0, rank1 = cpu_ranks(tp_pair, None, "row bias grad doubled on rank 1")
    assert rank0["ok"], rank0
    # Every failure is that grad's, in every step and metamorphic check that records it.
    assert not rank1["ok"] and rank1["failed"] and all(n.endswith("2.bias.grad") for n in rank1["failed"]), rank1
