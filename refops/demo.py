"""The demo pipeline the CLI traces: a small MLP built on ``meta`` and trained a few steps."""

from __future__ import annotations

import dataclasses

import torch

from . import ops
from .trace import trace

__all__ = ["DemoResult", "build_demo_model", "run_demo"]


def build_demo_model(device: torch.device | str, hidden: int = 32, ffn: int = 64) -> ops.Sequential:
    """LayerNorm -> Linear -> GELU -> Linear, TE's MLP shape in miniature."""
    return ops.Sequential(
        ops.LayerNorm(hidden, device=device),
        ops.Linear(hidden, ffn, device=device),
        ops.GELU(),
        ops.Linear(ffn, hidden, device=device),
    )


@dataclasses.dataclass
class DemoResult:
    """What happened: the trace of each step, the losses, and the identity checks."""

    step_traces: list[trace]
    losses: list[float]
    parameters_kept_identity: bool
    optimizer_holds_live_parameters: bool
    devices: set[str]


def run_demo(steps: int = 3, *, meta: bool = True, seed: int = 0) -> DemoResult:
    """Build the model (on meta unless told otherwise), make the optimizer, train ``steps`` steps."""
    torch.manual_seed(seed)
    device = torch.get_default_device()
    with trace() as construction:
        model = build_demo_model("meta" if meta else device)
    ids_before = [id(p) for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step_traces, losses = [construction], []
    for _ in range(steps):
        x = torch.randn(8, 32, device=device)
        with trace() as t:
            optimizer.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            optimizer.step()
        step_traces.append(t)
        losses.append(loss.item())
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    return DemoResult(
        step_traces=step_traces,
        losses=losses,
        parameters_kept_identity=[id(p) for p in model.parameters()] == ids_before,
        optimizer_holds_live_parameters=held == {id(p) for p in model.parameters()},
        devices={str(p.device) for p in model.parameters()},
    )
