"""Delayed-scaling updates visit the recipe states in registration order, the same on every rank.

With amax reduction each state's update is a collective (an all-reduce of its amaxes), so two ranks
that visit the states in different orders pair one state's amaxes with another's. A ``WeakSet``
iterates in an order that depends on object addresses, which differ between processes.
"""

from __future__ import annotations

import gc

from refops.quantization import state as quantization_state


class _State:
    """Stands in for a DelayedScalingRecipeState: records when its update runs."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def update_scales(self, reduction_group=None) -> None:
        self.log.append(self.name)


def test_updates_run_in_registration_order_and_forget_dead_states(monkeypatch):
    monkeypatch.setattr(quantization_state, "_STATE", quantization_state._GlobalState())
    log: list[str] = []
    states = [_State(f"s{i}", log) for i in range(20)]
    for s in reversed(states[10:]):  # an order unrelated to creation or address
        quantization_state.register_delayed_state(s, "forward")
    for s in states[:10]:
        quantization_state.register_delayed_state(s, "forward")
    quantization_state.register_delayed_state(states[12], "forward")  # registering again keeps its place
    quantization_state._update_delayed_states("forward", None)
    assert log == [f"s{i}" for i in range(19, 9, -1)] + [f"s{i}" for i in range(10)]
    del states[5], s
    gc.collect()
    log.clear()
    quantization_state._update_delayed_states("forward", None)
    assert "s5" not in log and len(log) == 19  # weakly held, as before
