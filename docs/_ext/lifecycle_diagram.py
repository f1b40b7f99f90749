"""The lifecycle page's sequence diagram: a real trace of a meta-built model's first training step.

Nothing here is drawn by hand. The model is built on ``meta``, an optimizer is created
before any parameter has storage, and the first forward and backward run inside
:class:`refops.trace`; :meth:`refops.trace.render_mermaid` turns the recorded events
into the diagram. If the lifecycle changes, the diagram changes with it.
"""

from __future__ import annotations

import torch

import refops as te

__all__ = ["FILE_NAME", "build_model", "first_step_trace", "diagram_bytes"]

FILE_NAME = "lifecycle-first-step.mmd"


def build_model() -> te.ops.Sequential:
    """Linear -> GELU -> Linear, every parameter on ``meta`` (nothing allocated)."""
    return te.ops.Sequential(
        te.ops.Linear(16, 32, device="meta"),
        te.ops.GELU(),
        te.ops.Linear(32, 16, device="meta"),
    )


def first_step_trace() -> te.trace:
    """The events of the first forward and backward of :func:`build_model` (seeded, on CPU)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("cpu"):  # materialize on the CPU on any machine (a GPU's would be the default)
            model = build_model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the meta parameters
        x = torch.randn(4, 16, device="cpu")
        with te.trace() as t:
            model(x).square().mean().backward()
        optimizer.step()
    return t


def diagram_bytes() -> bytes:
    """The Mermaid source of the first step, UTF-8, ending with a newline."""
    return (first_step_trace().render_mermaid() + "\n").encode()
