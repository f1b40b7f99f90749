"""``autocast`` / ``quantized_model_init`` leave nothing behind: exited in any order, on any thread
(``docs/api/refops.md#threads-and-nesting``).

Issue #38 item 3: two threads whose exits interleaved left DelayedScaling on for the whole process, since
each ``__exit__`` restored a snapshot taken while the other thread's context was open. Every thread test
synchronises through barriers with a timeout and joins with one, so a regression fails instead of hanging.
"""

from __future__ import annotations

import itertools
import threading
from typing import Callable

import pytest
import torch

import refops as te
from refops.quantization import state as quantization_state
from refops.quantization.thread_state import current
from refops.recipe import DelayedScaling, Float8CurrentScaling, MXFP8BlockScaling

TIMEOUT_S = 20.0


def _run_threads(*bodies: Callable[[threading.Barrier], None]) -> None:
    """Run each body on its own thread with a shared barrier; re-raise the first failure; never hang."""
    barrier = threading.Barrier(len(bodies), timeout=TIMEOUT_S)
    errors: list[BaseException] = []

    def wrap(body: Callable[[threading.Barrier], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body(barrier)
            except BaseException as error:  # reported on the main thread
                errors.append(error)
                barrier.abort()
        return run

    threads = [threading.Thread(target=wrap(body), daemon=True) for body in bodies]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a thread did not finish in time"
    if errors:
        raise errors[0]


def _assert_off() -> None:
    s = current()
    assert (s.depth, te.quantization.state.is_quantization_enabled(), quantization_state.get_autocast_recipe()) == (
        0, False, None)
    assert not quantization_state.with_quantized_parameters()
    assert quantization_state.get_quantized_parameters_recipe() is None


def test_interleaved_exits_on_two_threads_leave_quantization_off_everywhere():
    """A enters, B enters, A exits, B exits (the red team's probe); then a forward on any thread runs unquantized."""
    seen: dict[str, object] = {}

    def a(barrier: threading.Barrier) -> None:
        ctx = te.autocast(recipe=DelayedScaling())
        ctx.__enter__()
        barrier.wait()  # both inside
        seen["a inside"] = type(quantization_state.get_autocast_recipe())
        ctx.__exit__(None, None, None)
        barrier.wait()  # A out, B still in
        seen["a after"] = quantization_state.get_autocast_recipe()
        barrier.wait()

    def b(barrier: threading.Barrier) -> None:
        ctx = te.autocast(recipe=Float8CurrentScaling())
        ctx.__enter__()
        barrier.wait()
        seen["b inside"] = type(quantization_state.get_autocast_recipe())
        barrier.wait()
        seen["b while a is out"] = type(quantization_state.get_autocast_recipe())
        ctx.__exit__(None, None, None)
        barrier.wait()
        seen["b after"] = quantization_state.get_autocast_recipe()

    for _ in range(5):  # the probe failed 5 of 5 times before the fix
        _run_threads(a, b)
        assert seen == {"a inside": DelayedScaling, "b inside": Float8CurrentScaling, "a after": None,
                        "b while a is out": Float8CurrentScaling, "b after": None}
        _assert_off()
    op = te.ops.Linear(16, 16)
    x = torch.randn(4, 16)
    assert torch.equal(op(x), x @ op.weight.t() + op.bias)  # fp32, not FP8


def test_a_thread_never_sees_another_threads_autocast():
    seen: list[object] = []

    def inside(barrier: threading.Barrier) -> None:
        with te.autocast(recipe=MXFP8BlockScaling()):
            barrier.wait()
            barrier.wait()

    def outside(barrier: threading.Barrier) -> None:
        barrier.wait()
        seen.append(quantization_state.get_autocast_recipe())
        seen.append(quantization_state.is_quantization_enabled())
        barrier.wait()

    _run_threads(inside, outside)
    assert seen == [None, False]


def test_a_context_left_on_another_thread_restores_its_own_thread():
    outer, inner = te.autocast(recipe=DelayedScaling()), te.autocast(recipe=Float8CurrentScaling())
    outer.__enter__()
    inner.__enter__()
    _run_threads(lambda barrier: outer.__exit__(None, None, None))  # the outer one, out of order, elsewhere
    assert isinstance(quantization_state.get_autocast_recipe(), Float8CurrentScaling)  # the innermost stays
    inner.__exit__(None, None, None)
    _assert_off()


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))), ids=str)
def test_nested_contexts_left_in_any_order_keep_the_innermost_open_one_in_force(order):
    """Out of order within one thread is defined, not an error: the innermost context still open is in force."""
    recipes = [DelayedScaling(), Float8CurrentScaling(), MXFP8BlockScaling()]
    contexts = [te.autocast(recipe=r) for r in recipes]
    inits = [te.quantized_model_init(recipe=r) for r in recipes]
    for ctx, init in zip(contexts, inits):
        ctx.__enter__()
        init.__enter__()
    still_open = [0, 1, 2]
    for i in order:
        contexts[i].__exit__(None, None, None)
        inits[i].__exit__(None, None, None)
        still_open.remove(i)
        expected = recipes[still_open[-1]] if still_open else None
        assert quantization_state.get_autocast_recipe() is expected
        assert quantization_state.get_quantized_parameters_recipe() is expected
        assert current().depth == len(still_open)
    _assert_off()


@pytest.mark.parametrize("first_out", ["outer", "inner"])
def test_the_span_updates_forward_scales_once_whichever_context_leaves_last(first_out):
    recipe = DelayedScaling(amax_history_len=4)
    op = te.ops.BasicLinear(16, 8)
    outer, inner = te.autocast(recipe=recipe), te.autocast(recipe=recipe)
    outer.__enter__()
    inner.__enter__()
    op(torch.randn(4, 16, requires_grad=True))
    history = op._recipe_states["forward"].amax_history
    first, last = (outer, inner) if first_out == "outer" else (inner, outer)
    first.__exit__(None, None, None)
    assert history[-1].abs().sum() == 0  # not yet: the span is still open
    last.__exit__(None, None, None)
    assert history[-1].abs().sum() > 0 and history[0].abs().sum() == 0  # rolled once
    _assert_off()


def test_the_opener_decides_the_update_when_it_leaves_first():
    """An enabled outermost autocast left before a disabled inner one: the update still runs, at the last exit."""
    op = te.ops.BasicLinear(16, 8)
    outer, inner = te.autocast(recipe=DelayedScaling()), te.autocast(enabled=False)
    outer.__enter__()
    op(torch.randn(4, 16, requires_grad=True))
    inner.__enter__()
    outer.__exit__(None, None, None)
    assert quantization_state.get_autocast_recipe() is None  # the disabled one is in force
    inner.__exit__(None, None, None)
    assert op._recipe_states["forward"].amax_history[-1].abs().sum() > 0


def test_reentering_an_active_context_or_leaving_an_inactive_one_is_an_error():
    ctx, init = te.autocast(recipe=DelayedScaling()), te.quantized_model_init(recipe=DelayedScaling())
    with ctx, pytest.raises(RuntimeError, match="refops.autocast: this context is already active"):
        ctx.__enter__()
    with init, pytest.raises(RuntimeError, match="refops.quantized_model_init: this context is already active"):
        init.__enter__()
    with pytest.raises(RuntimeError, match="refops.autocast: __exit__ of a context that is not active"):
        ctx.__exit__(None, None, None)
    with pytest.raises(RuntimeError, match="refops.quantized_model_init: __exit__ of a context that is not active"):
        init.__exit__(None, None, None)
    _assert_off()
    with ctx:  # a context left is usable again
        assert quantization_state.is_quantization_enabled()
    _assert_off()


def test_quantized_model_init_on_two_threads_builds_each_threads_own_kind():
    built: dict[str, bool] = {}

    def quantized(barrier: threading.Barrier) -> None:
        with te.quantized_model_init(recipe=Float8CurrentScaling()):
            barrier.wait()
            built["quantized"] = isinstance(te.ops.Linear(16, 16).weight, te.QuantizedTensor)
            barrier.wait()

    def plain(barrier: threading.Barrier) -> None:
        barrier.wait()
        built["plain"] = isinstance(te.ops.Linear(16, 16).weight, te.QuantizedTensor)
        barrier.wait()

    _run_threads(quantized, plain)
    assert built == {"quantized": True, "plain": False}
