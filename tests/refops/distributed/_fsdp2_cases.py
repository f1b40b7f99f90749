"""Models, data and training loops shared by the FSDP2 tests (``docs/distributed.md#what-refops-promises-under-fsdp2``).

The model is LayerNorm(64) -> Linear(64, 128) -> GELU -> Linear(128, 64) (sizes are multiples of 32 and
the shards of 64 and 32 rows are too, so MXFP8 can quantize them), trained with MSE and Adam (lr 1e-2).
The global batch of 128 rows is split in halves, one per rank; FSDP2 averages the gradients over the
ranks, which makes a step equal to a single-process step on the whole batch.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import refops as te
from refops.sharding import reset_parameter_owners

SEED = 1234
DATA_SEED = 99
BATCH = 128
STEPS = 3
LR = 1e-2


def blocks(device: str = "cpu") -> torch.nn.Sequential:
    """Two refops blocks in a torch container: each block may be sharded on its own."""
    return torch.nn.Sequential(
        te.ops.Sequential(te.ops.LayerNorm(64, device=device), te.ops.Linear(64, 128, device=device), te.ops.GELU()),
        te.ops.Sequential(te.ops.Linear(128, 64, device=device)),
    )


def flat(device: str = "cpu") -> te.ops.Sequential:
    """The same model as one refops Sequential (one fuser)."""
    return te.ops.Sequential(
        te.ops.LayerNorm(64, device=device),
        te.ops.Linear(64, 128, device=device),
        te.ops.GELU(),
        te.ops.Linear(128, 64, device=device),
    )


def torch_sequential(device: str = "cpu") -> torch.nn.Sequential:
    """The same model as a torch.nn.Sequential of refops ops (each op runs through its own __call__)."""
    return torch.nn.Sequential(*flat(device))


def build(factory: Callable[[str], torch.nn.Module], device: str = "cpu", *, seed: int = SEED,
          recipe: Any = None) -> torch.nn.Module:
    """``factory(device)`` under ``seed`` (inside ``quantized_model_init(recipe)`` when a recipe is given)."""
    torch.manual_seed(seed)
    if recipe is None:
        return factory(device)
    with te.quantized_model_init(enabled=True, recipe=recipe):
        return factory(device)


def wide(device: str = "cpu") -> te.ops.Sequential:
    """A model whose weights shard into blocks of 128 rows over 2 ranks (FP8 block scaling's 2-D tiles)."""
    return te.ops.Sequential(
        te.ops.LayerNorm(64, device=device),
        te.ops.Linear(64, 256, device=device),
        te.ops.GELU(),
        te.ops.Linear(256, 256, device=device),
    )


def data(out_features: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(DATA_SEED)
    return torch.randn(BATCH, 64, generator=g), torch.randn(BATCH, out_features, generator=g)


def local_rows(t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    n = t.shape[0] // world_size
    return t[rank * n : (rank + 1) * n]


def mesh(world_size: int):
    return init_device_mesh("cpu", (world_size,))


def shard(model: torch.nn.Module, world_size: int, *, children: bool) -> torch.nn.Module:
    """``fully_shard`` on every child (when ``children``) and then on the root, as TE's FSDP2 tests do."""
    m = mesh(world_size)
    if children:
        for child in model.children():
            fully_shard(child, mesh=m)
    fully_shard(model, mesh=m)
    return model


def reset_all(model: torch.nn.Module) -> None:
    """``reset_parameters()`` once per parameter owner (refops.sharding.reset_parameter_owners)."""
    reset_parameter_owners(model)


def train(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor, *, steps: int = STEPS, recipe: Any = None,
          after_step: Optional[Callable[[int], None]] = None, trace_kinds: Optional[list[str]] = None,
          amax_reduction_group: Any = None):
    """Adam steps on ``(x, y)``; returns the losses, and the trace of each step when ``trace_kinds`` is given.

    ``amax_reduction_group``: the group delayed scaling reduces its amaxes over (as ranks of one data-parallel
    model must, to keep their scales equal)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    losses, traces = [], []
    for step in range(steps):
        optimizer.zero_grad()
        with te.trace(kinds=trace_kinds) as t, te.autocast(enabled=recipe is not None, recipe=recipe,
                                                           amax_reduction_group=amax_reduction_group):
            loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        traces.append(t)
        if after_step is not None:
            after_step(step)
    return losses, traces


def global_loss(losses: list[torch.Tensor]) -> list[float]:
    """The mean of the ranks' losses (each rank saw half the batch): the full-batch loss."""
    out = []
    for loss in losses:
        total = loss.clone()
        torch.distributed.all_reduce(total)
        out.append(total.item() / torch.distributed.get_world_size())
    return out


def full_values(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter's full value, by name (``full_tensor()`` for DTensors; a collective)."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, p in model.named_parameters():
        value = p.full_tensor() if isinstance(p, DTensor) else p
        out[name] = _plain(value.detach())
    return out


def _plain(t: torch.Tensor) -> torch.Tensor:
    from refops.quantization.quantized_tensor import QuantizedTensor

    return t.dequantize() if isinstance(t, QuantizedTensor) else t.clone()


def reference(factory: Callable[[str], torch.nn.Module], *, recipe: Any = None, steps: int = STEPS,
              out_features: int = 64):
    """Single-process training on the whole batch: (losses, final parameters, initial parameters)."""
    model = build(factory, recipe=recipe)
    initial = {n: _plain(p.detach()) for n, p in model.named_parameters()}
    x, y = data(out_features)
    losses, _ = train(model, x, y, steps=steps, recipe=recipe)
    return [loss.item() for loss in losses], {n: _plain(p.detach()) for n, p in model.named_parameters()}, initial


def max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)
