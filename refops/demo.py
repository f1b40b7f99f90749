"""The demo pipeline the CLI traces: a small MLP built on ``meta`` and trained a few steps."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Optional

import torch

from . import ops
from .ops.placement import default_parameter_device
from .quantization.state import autocast, quantized_model_init
from .trace import instance_names, trace

__all__ = ["DemoResult", "build_demo_model", "run_demo"]

HIDDEN, FFN = 128, 256  # multiples of every recipe's block size


def build_demo_model(device: torch.device | str, hidden: int = HIDDEN, ffn: int = FFN) -> ops.Sequential:
    """LayerNorm -> Linear -> GELU -> Linear, TE's MLP shape in miniature."""
    return ops.Sequential(
        ops.LayerNorm(hidden, device=device),
        ops.Linear(hidden, ffn, device=device),
        ops.GELU(),
        ops.Linear(ffn, hidden, device=device),
    )


@dataclasses.dataclass
class DemoResult:
    """What happened: the trace of construction and of each step, the losses, the identity checks, and each op's
    path in the model (``op_names``, for ``trace.render_text``)."""

    step_traces: list[trace]
    losses: list[float]
    parameters_kept_identity: bool
    optimizer_holds_live_parameters: bool
    devices: set[str]
    weight_type: str
    #: ``id(op) -> its path in the model`` (``"1.basic_ops.0"``): :func:`refops.trace.instance_names`.
    op_names: dict[int, str] = dataclasses.field(default_factory=dict)


def run_demo(
    steps: int = 3, *, meta: bool = True, seed: int = 0, recipe: Optional[Any] = None, quantized_weights: bool = False
) -> DemoResult:
    """Build the model (on meta unless told otherwise), make the optimizer, train ``steps`` steps.

    Raises:
        ValueError: ``steps < 1``: a meta-built model would stay on meta, and the identity checks would hold
            only because nothing was materialized.
    """
    if steps < 1:
        raise ValueError(f"run_demo: steps must be >= 1 (got {steps})")
    torch.manual_seed(seed)
    device = default_parameter_device()  # where the meta-built model materializes: the inputs go there too
    with trace() as construction, quantized_model_init(enabled=quantized_weights, recipe=recipe):
        model = build_demo_model("meta" if meta else device)
    ids_before = [id(p) for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step_traces, losses = [construction], []
    for _ in range(steps):
        x = torch.randn(HIDDEN, HIDDEN, device=device)
        with trace() as t:
            optimizer.zero_grad()
            context = autocast(recipe=recipe) if recipe is not None else contextlib.nullcontext()
            with context:
                loss = model(x).float().square().mean()
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
        weight_type=type(model[1].weight).__name__,
        op_names=instance_names(model),
    )
