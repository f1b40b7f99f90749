"""The distributed lifecycle demo behind ``python -m refops trace --distributed N``.

Each of N ranks (forked gloo processes on the CPU, :func:`refops.distributed.run_on_ranks`) builds
``LayerNorm -> Linear -> GELU -> Linear`` on the meta device, shards it with FSDP2's ``fully_shard``,
materializes it the FSDP2 way (``to_empty`` then ``reset_parameters()`` on each parameter owner), and
trains it with Adam on its part of the batch, recording the lifecycle events of every phase with
:class:`refops.trace`. Each rank also checks the promises of ``docs/distributed.md``: every parameter is
still the same DTensor object after materialization and training, and the full values equal a
single-process eager build under the same seed, bit for bit.
"""

from __future__ import annotations

import dataclasses
import torch

from ..trace import instance_names
from ..trace import trace as lifecycle_trace
from .launch import run_on_ranks

__all__ = ["RankReport", "run_distributed_demo"]

SEED = 0
FEATURES, HIDDEN, BATCH, LR = 32, 64, 64, 1e-2


@dataclasses.dataclass
class RankReport:
    """What one rank saw: its lifecycle events per phase and the checks it made."""

    rank: int
    phases: list[tuple[str, list[str]]]
    losses: list[float]
    kept_identity: bool
    all_dtensors: bool
    init_equals_single_process: bool
    local_shapes: dict[str, tuple[int, ...]]


def _model(device: str) -> torch.nn.Module:
    from .. import ops

    return ops.Sequential(
        ops.LayerNorm(FEATURES, device=device),
        ops.Linear(FEATURES, HIDDEN, device=device),
        ops.GELU(),
        ops.Linear(HIDDEN, FEATURES, device=device),
    )


def _rank_demo(rank: int, world_size: int, steps: int) -> RankReport:
    """One rank's run: meta build, shard, materialize, train (see the module docstring)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from ..sharding.parameter_owners import reset_parameter_owners

    phases: list[tuple[str, list[str]]] = []
    torch.manual_seed(SEED)
    with lifecycle_trace() as t:
        model = _model("meta")
    phases.append(("build on meta", t.lines(instance_names(model))))

    fully_shard(model, mesh=init_device_mesh("cpu", (world_size,)))
    model.to_empty(device="cpu")
    before = dict(model.named_parameters())
    torch.manual_seed(SEED)  # the construction RNG state: the same on every rank
    with lifecycle_trace() as t:
        reset_parameter_owners(model)
    phases.append(("fully_shard, to_empty, reset_parameters", t.lines(instance_names(model))))

    torch.manual_seed(SEED)
    eager = _model("cpu")
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    init_equal = all(torch.equal(full[n], p) for n, p in eager.named_parameters())

    generator = torch.Generator().manual_seed(SEED + 1)
    x, y = torch.randn(BATCH, FEATURES, generator=generator), torch.randn(BATCH, FEATURES, generator=generator)
    rows = BATCH // world_size
    x, y = x[rank * rows : (rank + 1) * rows], y[rank * rows : (rank + 1) * rows]
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses = []
    for step in range(1, steps + 1):
        with lifecycle_trace() as t:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        torch.distributed.all_reduce(total)
        losses.append(total.item() / world_size)
        phases.append((f"training step {step}", t.lines(instance_names(model))))
    after = dict(model.named_parameters())
    return RankReport(
        rank=rank,
        phases=phases,
        losses=losses,
        kept_identity=after.keys() == before.keys() and all(after[n] is before[n] for n in before),
        all_dtensors=all(isinstance(p, DTensor) for p in after.values()),
        init_equals_single_process=init_equal,
        local_shapes={n: tuple(p.to_local().shape) for n, p in after.items()},
    )


def run_distributed_demo(world_size: int = 2, steps: int = 3, *, timeout: float = 120.0) -> list[RankReport]:
    """Run the demo on ``world_size`` forked gloo ranks; one :class:`RankReport` per rank, in rank order."""
    if world_size < 1:
        raise ValueError(f"run_distributed_demo: world_size must be >= 1 (got {world_size})")
    if steps < 1:
        raise ValueError(f"run_distributed_demo: steps must be >= 1 (got {steps})")
    return run_on_ranks(_rank_demo, world_size, steps, backend="gloo", timeout=timeout)
