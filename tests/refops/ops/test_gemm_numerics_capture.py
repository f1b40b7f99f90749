"""The GEMM numerics mode is captured with the forward: a backward's dgrad and wgrad run under its forward's mode,
wherever ``backward()`` is called (``docs/tensor-cores.md#the-mode-is-captured-with-the-forward``).

fp32 GEMMs under ``gemm_numerics("hopper")`` multiply TF32-rounded operands, which needs no mmaemu: most tests
here use them. The FP8 tests at the end compute Hopper FP8 GEMMs and skip without mmaemu.
"""

from __future__ import annotations

import importlib.util
import threading

import pytest
import torch
import torch.utils.checkpoint

import refops
from refops import ops
from refops.kernels import ReferenceKernels, use_backend
from refops.kernels.gemm_numerics import gemm_role
from refops.recipe import DelayedScaling, Float8CurrentScaling

from _grouped_linear_cases import IN, OUT, ROWS, make_op, splits

MODES = ("exact", "hopper")


from _recording_kernels import RecordingKernels  # noqa: E402


def _model() -> ops.Sequential:
    torch.manual_seed(0)
    return ops.Sequential(ops.Linear(64, 128), ops.GELU(), ops.Linear(128, 32))


def _step(forward_mode, backward_mode, *, recipe=None, kernels=None, thread=False):
    """A forward under ``forward_mode``, its backward under ``backward_mode`` (on another thread if asked);
    the input's and the weights' grads."""
    model = _model()
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    with use_backend(kernels or ReferenceKernels()), refops.gemm_numerics(forward_mode):
        with refops.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)

    def backward():
        with refops.gemm_numerics(backward_mode):
            y.square().sum().backward()

    if thread:
        t = threading.Thread(target=backward)
        t.start()
        t.join()
    else:
        backward()
    return [x.grad, model[0].weight.grad, model[2].weight.grad]


def _equal(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("forward_mode", MODES)
@pytest.mark.parametrize("backward_mode", MODES)
def test_every_backward_gemm_runs_under_the_forward_s_mode(forward_mode, backward_mode):
    kernels = RecordingKernels()
    _step(forward_mode, backward_mode, kernels=kernels)
    roles = {role for role, _ in kernels.calls}
    assert roles == {"fprop", "dgrad", "wgrad"}
    assert {mode for _, mode in kernels.calls} == {forward_mode}, kernels.calls


def test_the_two_modes_differ_so_the_tests_below_can_fail():
    hopper, exact = _step("hopper", "hopper"), _step("exact", "exact")
    assert not any(torch.equal(h, e) for h, e in zip(hopper, exact))  # TF32 operands in every fp32 GEMM


@pytest.mark.parametrize("forward_mode,backward_mode", [("hopper", "exact"), ("exact", "hopper")])
def test_a_backward_in_another_mode_gets_its_forward_s_grads_bit_for_bit(forward_mode, backward_mode):
    assert _equal(_step(forward_mode, backward_mode), _step(forward_mode, forward_mode))


def test_a_backward_on_another_thread_gets_the_forward_s_mode():
    """What autograd does on a GPU: the backward runs on its device thread, where no context was entered."""
    kernels = RecordingKernels()
    grads = _step("hopper", "exact", kernels=kernels, thread=True)
    assert {mode for _, mode in kernels.calls} == {"hopper"}
    assert _equal(grads, _step("hopper", "hopper"))


def test_the_backward_leaves_no_mode_behind():
    _step("hopper", "exact")
    assert refops.gemm_numerics() == "exact"
    with refops.gemm_numerics("hopper"):
        _step("exact", "exact")
        assert refops.gemm_numerics() == "hopper"


def test_two_forwards_in_two_modes_keep_their_own_mode_in_one_backward():
    kernels = RecordingKernels()
    first, second = _model(), _model()
    x = torch.randn(8, 64, requires_grad=True)
    with use_backend(kernels):
        with refops.gemm_numerics("hopper"):
            h = first(x)
        y = second(x)  # exact
    (h.sum() + y.sum()).backward()
    assert kernels.calls.count(("dgrad", "hopper")) == 2 and kernels.calls.count(("dgrad", "exact")) == 2
    assert kernels.calls.count(("wgrad", "hopper")) == 2 and kernels.calls.count(("wgrad", "exact")) == 2


def test_a_non_reentrant_checkpoint_recomputes_under_the_mode_of_the_backward_that_needs_it():
    """torch's non-reentrant checkpoint recomputes the forward inside the first backward that unpacks a saved
    tensor, so the recomputation (and the backward of what it recomputes) gets the captured mode."""
    kernels = RecordingKernels()
    first, second = ops.Sequential(ops.Linear(64, 32)), ops.Sequential(ops.Linear(32, 16))
    x = torch.randn(8, 64, requires_grad=True)
    with use_backend(kernels), refops.gemm_numerics("hopper"):
        y = torch.utils.checkpoint.checkpoint(lambda t: second(first(t)), x, use_reentrant=False)
    with use_backend(kernels):
        y.sum().backward()
    assert [role for role, _ in kernels.calls].count("fprop") == 4  # two forwards, two recomputed
    assert {mode for _, mode in kernels.calls} == {"hopper"}, kernels.calls


def test_delayed_weight_grads_keep_the_mode_of_their_backward():
    """``delay_wgrad_compute``: the wgrad GEMMs run in ``backward_dw()``, after the backward and outside any context."""
    kernels = RecordingKernels()
    torch.manual_seed(3)
    eager = make_op("cpu")
    torch.manual_seed(3)
    delayed = make_op("cpu", delay_wgrad_compute=True)
    x, dy = torch.randn(ROWS, IN), torch.randn(ROWS, OUT)
    for op in (eager, delayed):
        with use_backend(kernels), refops.gemm_numerics("hopper"):
            y = op(x.clone().requires_grad_(), splits())
        y.backward(dy)
    with use_backend(kernels):
        delayed.backward_dw()
    wgrad_modes = [mode for role, mode in kernels.calls if role == "wgrad"]
    assert len(wgrad_modes) >= 2 * 3 and set(wgrad_modes) == {"hopper"}  # 3 non-empty groups, both ops
    for (name, p), (_, q) in zip(eager.named_parameters(), delayed.named_parameters()):
        assert torch.equal(p.grad, q.grad), name


# ------------------------------------------------------------------ FP8 GEMMs (mmaemu)
needs_mmaemu = pytest.mark.skipif(
    importlib.util.find_spec("mmaemu") is None,
    reason="FP8 GEMMs under gemm_numerics('hopper') need mmaemu (pip install 'refops[hopper]'), not installed",
)


@needs_mmaemu
@pytest.mark.parametrize("recipe", [Float8CurrentScaling, DelayedScaling])
def test_fp8_grads_of_a_hopper_forward_are_hopper_grads_wherever_backward_runs(recipe):
    inside = _step("hopper", "hopper", recipe=recipe())
    exact = _step("exact", "exact", recipe=recipe())
    assert not _equal(inside, exact)
    assert _equal(_step("hopper", "exact", recipe=recipe()), inside)  # the docs' example: backward after the with
    assert _equal(_step("exact", "hopper", recipe=recipe()), exact)
