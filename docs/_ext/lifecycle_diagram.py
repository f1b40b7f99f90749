"""The lifecycle page's sequence diagrams: a real first training step of a meta-built model.

Nothing here is drawn by hand. :func:`first_step` builds ``Sequential(Linear(16, 8))`` on ``meta``, creates an
optimizer before any parameter has storage, and runs the first forward and backward inside :class:`refops.trace`
and then ``optimizer.step()``, checking at each point which objects the optimizer, the fuser and ``Linear`` hold.

Three diagrams come from that one step:

* ``lifecycle-forward.mmd`` and ``lifecycle-backward.mmd``: the first forward, and the backward with the optimizer
  step, at the level of detail of the page's diagrams of TE before the fix (five lifelines at most, one arrow per
  step: the events of one step on several ops are one arrow). Each arrow is made from the recorded events and
  each note from a check, so a change in the lifecycle changes the picture, and a broken promise fails the build;
* ``lifecycle-first-step.mmd``: every event, one arrow each (:meth:`refops.trace.render_mermaid`), offered as a
  download: too wide to read inline.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import torch

import refops as te

__all__ = ["FILE_NAME", "FORWARD", "BACKWARD", "DIAGRAMS", "FirstStep", "build_model", "first_step",
           "first_step_trace", "diagram_bytes", "forward_diagram", "backward_diagram"]

FILE_NAME = "lifecycle-first-step.mmd"
FORWARD = "lifecycle-forward.mmd"
BACKWARD = "lifecycle-backward.mmd"


def build_model() -> te.ops.Sequential:
    """One ``Linear`` (a ``BasicLinear`` and a ``Bias``), every parameter on ``meta`` (nothing allocated)."""
    return te.ops.Sequential(te.ops.Linear(16, 8, device="meta"))


@dataclasses.dataclass(frozen=True)
class FirstStep:
    """What the first step recorded: the events of the forward and of the backward, and the checks."""

    forward: te.trace
    backward: te.trace
    cached: list[str]  #: the fuser's cache after the forward, by parameter name
    optimizer_holds_model_parameters: bool  #: before the forward, after it and after the step
    aliases_agree: bool  #: ``Linear.weight is basic_ops[0].weight`` (and bias) after the forward
    grad_devices: list[str]  #: of each parameter's ``.grad`` after the backward
    step_updated_in_place: bool  #: ``optimizer.step()`` changed the values of the model's own objects


@functools.cache
def first_step() -> FirstStep:
    """Run the first training step of :func:`build_model` (seeded, on the CPU), recording events and checks."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        with torch.device("cpu"):  # materialize on the CPU on any machine (a GPU's would be the default)
            model = build_model()
        linear = model[0]
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)  # holds the meta parameters
        params = dict(model.named_parameters())

        def optimizer_holds_them() -> bool:
            held = optimizer.param_groups[0]["params"]
            return len(held) == len(params) and all(a is b for a, b in zip(held, model.parameters()))

        holds = optimizer_holds_them()
        with te.trace() as forward:
            loss = model(torch.randn(4, 16)).square().mean()
        names = {id(p): name.rpartition(".")[2] for name, p in params.items()}
        cached = [names.get(id(p), "another object") for p in model._module_groups[0]._flat_basic_op_params]
        holds = holds and optimizer_holds_them()
        aliases = linear.weight is linear.basic_ops[0].weight and linear.bias is linear.basic_ops[1].bias
        with te.trace() as backward:
            loss.backward()
        grads = [str(p.grad.device) if p.grad is not None else "none" for p in model.parameters()]
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
        updated = all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    holds = holds and optimizer_holds_them()
    return FirstStep(forward, backward, cached, holds, aliases, grads, updated)


def first_step_trace() -> te.trace:
    """Every event of the first forward and backward, in one trace."""
    step = first_step()
    full = te.trace()
    full.events = [*step.forward.events, *step.backward.events]
    return full


def diagram_bytes() -> bytes:
    """The full trace's Mermaid source, one arrow per event, UTF-8, ending with a newline."""
    return (first_step_trace().render_mermaid() + "\n").encode()


def _names(events: list[te.Event]) -> str:
    """The ops or members the events are about, each once, in order: ``"BasicLinear, Bias"``."""
    return ", ".join(dict.fromkeys(e.subject.rpartition(".")[2] for e in events))


def _one(events: list[te.Event], kind: str) -> te.Event:
    (event,) = [e for e in events if e.kind == kind]
    return event


def _require(condition: bool, promise: str) -> None:
    if not condition:
        raise RuntimeError(f"the lifecycle page's diagram states a promise that refops broke: {promise}")


_PARTICIPANTS = {
    "User": "participant User",
    "Optimizer": "participant Optimizer",
    "Fuser": "participant Fuser as OperationFuser",
    "Linear": "participant Linear as te.ops.Linear",
    "Basic": "participant Basic as BasicLinear, Bias",
    "Autograd": "participant Autograd",
}


def _diagram(participants: list[str], lines: list[str]) -> bytes:
    body = ["sequenceDiagram", *(f"    {_PARTICIPANTS[p]}" for p in participants), *(f"    {x}" for x in lines)]
    return ("\n".join(body) + "\n").encode()


def forward_diagram() -> bytes:
    """The first forward: the same five lifelines and level of detail as the page's diagram of TE before the fix."""
    step = first_step()
    events = step.forward.events
    recipes = ", ".join(dict.fromkeys(str(e.details["recipe"]) for e in events if e.kind == "recipe_state"))
    hooked = [e for e in events if e.kind == "first_forward_hook"]
    materialized = [e for e in events if e.kind == "materialize"]
    synced = [e for e in events if e.kind == "alias_sync"]
    refresh = _one(events, "cache_refresh")
    first = _one(events, "backward_selection").details["first_op_requiring_backward"]
    _one(events, "fusion_plan")
    forward_ops = [e for e in events if e.kind == "forward_op"]
    _require([e.subject for e in hooked] == ["Linear"], "the first-forward hook runs on the top-level op")
    _require(all(e.details["kept_identity"] for e in materialized), "materialization keeps the Parameter objects")
    _require(step.aliases_agree, "Linear's aliases are its basic ops' parameters")
    _require(refresh.details["reason"] == "first forward", "the fuser fills its cache at the first forward")
    aliases = f"re-synced its aliases {_names(synced)}" if synced else "its aliases were already the same objects"
    state = f"reset_recipe_state({recipes})".replace("(none)", "(None), no autocast")
    return _diagram(["User", "Fuser", "Linear", "Basic", "Autograd"], [
        "User->>Fuser: model(x), the first forward",
        "Note over Fuser: its cache is empty",
        f"Fuser->>Basic: {state}",
        "Fuser->>Linear: pre_first_fuser_forward()",
        f"Linear->>Basic: materialize {_names(materialized)}",
        "Note over Basic: the same Parameter objects, filled in place",
        f"Note over Linear: {aliases}",
        f"Fuser->>Fuser: cache {', '.join(step.cached)} ({refresh.details['reason']})",
        f"Fuser->>Fuser: choose first op requiring backward ({first}) and fusions",
        f"Fuser->>Autograd: apply(x, {', '.join(step.cached)}), the cached objects",
        f"Autograd->>Basic: forward of {_names(forward_ops)}",
        "Autograd-->>User: y",
    ])


def backward_diagram() -> bytes:
    """The backward and the optimizer step, with the lifelines of the page's diagram of TE before the fix."""
    step = first_step()
    backward_ops = [e for e in step.backward.events if e.kind == "backward_op"]
    _require(step.optimizer_holds_model_parameters, "an optimizer built on meta holds the model's parameters")
    _require(len(set(step.grad_devices)) == 1 and "none" not in step.grad_devices, "every parameter gets a grad")
    _require(step.step_updated_in_place, "optimizer.step() updates the model's own parameters")
    device = step.grad_devices[0]
    return _diagram(["User", "Autograd", "Basic", "Optimizer"], [
        "Note over Optimizer: built on meta, holds weight, bias",
        "User->>Autograd: loss.backward()",
        f"Autograd->>Basic: backward of {_names(backward_ops)}",
        f"Basic-->>Autograd: grads on {device}",
        f"Autograd-->>User: weight.grad, bias.grad on {device}",
        "User->>Optimizer: optimizer.step()",
        "Optimizer->>Basic: update weight, bias: the same objects",
    ])


#: File name -> function returning its bytes, for ``refops_artifacts.ARTIFACTS``.
DIAGRAMS: dict[str, Callable[[], bytes]] = {
    FORWARD: forward_diagram,
    BACKWARD: backward_diagram,
    FILE_NAME: diagram_bytes,
}
