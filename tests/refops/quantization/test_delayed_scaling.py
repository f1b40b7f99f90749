"""Delayed scaling: amax histories and scales over several steps, against values computed by hand.

The state machine (``docs/recipes/delayed-scaling.md#the-arithmetic``): each cast uses the slot's current
scale and max-accumulates the pre-scale amax into history row 0; the forward
slots update when the outermost autocast exits (grad enabled), the backward
slots when the first module's backward ends; a slot updates to
``fmax * 2^-margin / max(window)`` and its history rolls.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.recipe import DelayedScaling, Format

E4M3_MAX, E5M2_MAX = 448.0, 57344.0


def _amax(t: torch.Tensor) -> float:
    return t.detach().abs().max().item()


def _scale(fmax: float, margin: int, amax: float) -> float:
    """The fp32 scale by hand: RN((fmax * 2^-margin) / amax), one fp32 division."""
    return (torch.tensor(fmax * 2.0**-margin, dtype=torch.float32) / torch.tensor(amax, dtype=torch.float32)).item()


def _q_dq(t: torch.Tensor, scale: float, fp8: torch.dtype, fmax: float) -> torch.Tensor:
    """Quantize-dequantize exactly as the delayed-scaling cast does: Q(RN(x*s)) * RN(1/s)."""
    s = torch.tensor(scale, dtype=torch.float32)
    q = (t.float() * s).clamp(-fmax, fmax).to(fp8).float()
    return q * (1.0 / s)


def test_scales_and_histories_over_three_steps(device):
    """TE's test_fp8_scale_update: HYBRID, margin 2, history 8, a standalone BasicLinear."""
    recipe = DelayedScaling(fp8_format=Format.HYBRID, margin=2, amax_history_len=8)
    op = te.ops.BasicLinear(32, 16, device=device)
    seen_x, seen_w, seen_dy = [], [], []
    scale_x = scale_w = scale_dy = 1.0  # the first step quantizes with scale 1
    for step in range(3):
        x = torch.randn(8, 32, device=device) * (step + 1)
        dy = torch.randn(8, 16, device=device) * 10 ** step
        with torch.no_grad():
            op.weight.copy_(torch.randn(16, 32, device=device) * (3 - step))
        x.requires_grad_(True)
        with te.autocast(recipe=recipe):
            y = op(x)
        y.backward(dy)
        seen_x.append(_amax(x))
        seen_w.append(_amax(op.weight))
        seen_dy.append(_amax(dy))

        # Outputs use the scales that were current during this step.
        xq = _q_dq(x, scale_x, torch.float8_e4m3fn, E4M3_MAX)
        wq = _q_dq(op.weight, scale_w, torch.float8_e4m3fn, E4M3_MAX)
        dyq = _q_dq(dy, scale_dy, torch.float8_e5m2, E5M2_MAX)
        torch.testing.assert_close(y, (xq.double() @ wq.double().t()).float(), rtol=1e-5, atol=1e-4)
        torch.testing.assert_close(x.grad, (dyq.double() @ wq.double()).float(), rtol=1e-5, atol=1e-4)

        # After the step: fmax / 2^margin / running max (the window of 8 holds every step so far).
        scale_x = _scale(E4M3_MAX, 2, max(seen_x))
        scale_w = _scale(E4M3_MAX, 2, max(seen_w))
        scale_dy = _scale(E5M2_MAX, 2, max(seen_dy))
        fwd_scale = op._recipe_states["forward"].scale
        bwd_scale = op._recipe_states["backward"].scale
        torch.testing.assert_close(fwd_scale.cpu(), torch.tensor([scale_x, scale_w], device="cpu"), rtol=0, atol=0)
        torch.testing.assert_close(bwd_scale.cpu(), torch.tensor([scale_dy], device="cpu"), rtol=0, atol=0)
        assert op.get_quantizer("forward", 0).scale.item() == scale_x

        history = op._recipe_states["forward"].amax_history.cpu()
        assert history.shape == (8, 2)
        assert torch.all(history[0] == 0)  # row 0 is the accumulator of the next step
        expected_tail = torch.tensor([seen_x[::-1], seen_w[::-1]], device="cpu").t().flip(0)
        assert torch.equal(history[8 - len(seen_x):], expected_tail)


def _scale_after_steps(op):
    return op._recipe_states["forward"].scale.clone()


def test_no_update_under_no_grad_but_amax_keeps_accumulating(device):
    recipe = DelayedScaling(amax_history_len=4)
    op = te.ops.BasicLinear(16, 16, device=device)
    x = torch.randn(4, 16, device=device) * 5
    with torch.no_grad(), te.autocast(recipe=recipe):
        op(x)
    state = op._recipe_states["forward"]
    assert torch.equal(state.scale.cpu(), torch.ones(2, device="cpu"))  # frozen
    assert state.amax_history[0, 0].item() == _amax(x)  # recorded
    x2 = torch.randn(4, 16, device=device) * 2
    with te.autocast(recipe=recipe):
        op(x2)
    # The update sees the max over both casts (row 0 accumulated them).
    assert state.scale[0].item() == _scale(E4M3_MAX, 0, max(_amax(x), _amax(x2)))


def test_update_happens_at_the_outermost_autocast_exit(device):
    recipe = DelayedScaling(amax_history_len=4)
    op = te.ops.BasicLinear(16, 16, device=device)
    x = torch.randn(4, 16, device=device)
    with te.autocast(recipe=recipe):
        with te.autocast(recipe=recipe):
            op(x)
        assert torch.equal(op._recipe_states["forward"].scale.cpu(), torch.ones(2, device="cpu")), "updated at an inner exit"
    assert op._recipe_states["forward"].scale[0].item() == _scale(E4M3_MAX, 0, _amax(x))


def test_unused_slot_keeps_its_scale_and_history(device):
    recipe = DelayedScaling(amax_history_len=4)
    used, unused = te.ops.BasicLinear(8, 8, device=device), te.ops.BasicLinear(8, 8, device=device)
    with te.autocast(recipe=recipe):
        used(torch.randn(2, 8, device=device))
        unused(torch.randn(2, 8, device=device))
    before_scale = unused._recipe_states["forward"].scale.clone()
    before_history = unused._recipe_states["forward"].amax_history.clone()
    with te.autocast(recipe=recipe):
        used(torch.randn(2, 8, device=device))
    assert torch.equal(unused._recipe_states["forward"].scale, before_scale)
    assert torch.equal(unused._recipe_states["forward"].amax_history, before_history)


def test_most_recent_algorithm_and_zero_or_inf_amax(device):
    recipe = DelayedScaling(amax_history_len=4, amax_compute_algo="most_recent")
    op = te.ops.BasicLinear(8, 8, device=device)
    big, small = torch.full((2, 8), 8.0, device=device), torch.full((2, 8), 2.0, device=device)
    for x in (big, small):
        with te.autocast(recipe=recipe):
            op(x)
    assert op._recipe_states["forward"].scale[0].item() == E4M3_MAX / 2.0  # the most recent, not the max
    with te.autocast(recipe=recipe):
        op(torch.full((2, 8), float("inf"), device=device))
    assert op._recipe_states["forward"].scale[0].item() == E4M3_MAX / 2.0  # inf amax keeps the old scale


def test_amax_history_length_change_resizes_state(device):
    op = te.ops.BasicLinear(8, 8, device=device)
    with te.autocast(recipe=DelayedScaling(amax_history_len=4)):
        op(torch.randn(2, 8, device=device))
    with te.autocast(recipe=DelayedScaling(amax_history_len=6)):
        op(torch.randn(2, 8, device=device))
    assert op._recipe_states["forward"].amax_history.shape == (6, 2)


def test_switching_recipe_type_rebuilds_state_with_a_warning(device):
    op = te.ops.BasicLinear(32, 32, device=device)
    with te.autocast(recipe=DelayedScaling()):
        op(torch.randn(32, 32, device=device))
    with pytest.warns(UserWarning, match="discards the amax history"):
        with te.autocast(recipe=te.recipe.Float8CurrentScaling()):
            op(torch.randn(32, 32, device=device))
    assert type(op.get_quantizer("forward", 0)).__name__ == "Float8CurrentScalingQuantizer"


def test_recipe_state_checkpoint_round_trip(device):
    recipe = DelayedScaling(amax_history_len=4)
    op = te.ops.BasicLinear(8, 8, device=device)
    for _ in range(3):
        x = torch.randn(4, 8, device=device, requires_grad=True)
        with te.autocast(recipe=recipe):
            y = op(x)
        y.sum().backward()
    state = op.state_dict()
    restored = te.ops.BasicLinear(8, 8, device="meta")
    restored.load_state_dict(state)
    for mode in ("forward", "backward"):
        a, b = op._recipe_states[mode], restored._recipe_states[mode]
        assert torch.equal(a.scale, b.scale) and torch.equal(a.amax_history, b.amax_history)
    x = torch.randn(4, 8, device=device)
    with te.autocast(recipe=recipe):
        assert torch.equal(op(x), restored(x))


def test_interleaved_microbatches_give_each_backward_its_own_history_row(device):
    """F1 F2 B1 B2, each forward in its own autocast (TE's pipeline-parallel schedule): the backward slots update
    at the end of B1 and of B2, one history row each, as TE's do; B2's amax is not merged into the next step's."""
    recipe = DelayedScaling(fp8_format=Format.HYBRID, amax_history_len=4)
    op = te.ops.BasicLinear(16, 8, device=device)
    x1, x2 = (torch.randn(4, 16, device=device, requires_grad=True) for _ in range(2))
    dy1, dy2 = torch.randn(4, 8, device=device), torch.randn(4, 8, device=device) * 8
    with te.autocast(recipe=recipe):
        y1 = op(x1)
    with te.autocast(recipe=recipe):
        y2 = op(x2)
    y1.backward(dy1)
    state = op._recipe_states["backward"]
    assert state.amax_history[-1, 0].item() == _amax(dy1)  # B1 rolled its own row
    assert state.scale[0].item() == _scale(E5M2_MAX, 0, _amax(dy1))
    y2.backward(dy2)
    assert state.amax_history[-2:, 0].tolist() == [_amax(dy1), _amax(dy2)]  # and B2 its own
    assert state.amax_history[0, 0].item() == 0  # nothing left over for the next step
    assert state.scale[0].item() == _scale(E5M2_MAX, 0, max(_amax(dy1), _amax(dy2)))
