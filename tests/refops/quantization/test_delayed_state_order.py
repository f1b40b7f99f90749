"""Delayed-scaling updates reach the states of the ops that ran, in first-use order, the same on every rank.

With amax reduction each state's update is a collective (an all-reduce of its amaxes), so every rank
must visit the same states in the same order. The set is what the program ran since the last update:
neither memory addresses (a ``WeakSet``'s order) nor the garbage collector (which frees unreachable
models at different moments on different ranks) can change it.
"""

from __future__ import annotations

import gc

import torch

import refops as te
from refops.quantization import state as quantization_state
from refops.quantization import thread_state
from refops.recipe import DelayedScaling


class _State:
    """Stands in for a DelayedScalingRecipeState: records when its update runs."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def update_scales(self, reduction_group=None) -> None:
        self.log.append(self.name)


def test_updates_run_in_first_use_order_once_and_the_set_survives_collection(monkeypatch):
    monkeypatch.setattr(thread_state._THREADS, "state", thread_state.ThreadState())
    log: list[str] = []
    states = [_State(f"s{i}", log) for i in range(20)]
    for s in reversed(states[10:]):  # an order unrelated to creation or address
        quantization_state.register_delayed_state(s, "forward")
    for s in states[:10]:
        quantization_state.register_delayed_state(s, "forward")
    quantization_state.register_delayed_state(states[12], "forward")  # used again: keeps its place
    del states[:], s
    gc.collect()  # no longer referenced anywhere else, yet still in use for this update
    quantization_state._update_delayed_states("forward", None)
    assert log == [f"s{i}" for i in range(19, 9, -1)] + [f"s{i}" for i in range(10)]
    log.clear()
    quantization_state._update_delayed_states("forward", None)
    assert log == []  # a new set starts after each update


def test_a_model_that_did_not_run_is_not_updated():
    recipe = DelayedScaling()
    ran, idle = te.ops.Linear(16, 16), te.ops.Linear(16, 16)
    x = torch.randn(16, 16)
    with te.autocast(recipe=recipe):
        idle(x)
    idle_state = idle.basic_ops[0]._recipe_states["forward"]
    history = idle_state.amax_history.clone()
    with te.autocast(recipe=recipe):
        ran(x)
    assert torch.equal(idle_state.amax_history, history)
    assert ran.basic_ops[0]._recipe_states["forward"].amax_history.abs().sum() > 0
