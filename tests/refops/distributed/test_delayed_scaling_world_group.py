"""Delayed scaling under an initialized process group reduces its amaxes over the default (world) group, as
TE does (``reduce_and_update_fp8_tensors``: ``all_reduce(..., group=None)`` whenever ``recipe.reduce_amax``
and the group has more than one rank; TE's ``_test_fp8_scale_update`` checks the scales against the amax of
the full tensors).

Each of 2 ranks runs one ``Linear`` step on its own rows (rank 1's 4 times larger) inside
``autocast(recipe=DelayedScaling())`` without a group. Afterwards every rank holds the scales of the full
tensors' amaxes, ``(fmax / 2^margin) / max over ranks``, bit for bit. With ``reduce_amax=False`` each rank
keeps its own. Expected values: fp32 arithmetic on the full tensors in the parent process.
"""

from __future__ import annotations

import pytest
import torch

import refops as te
from refops.recipe import DelayedScaling, Format

from _tp_reference import rank_device

ROWS, FEATURES = 16, 32
MARGIN = 1


def _data():
    g = torch.Generator().manual_seed(5)
    x = torch.rand(2 * ROWS, FEATURES, generator=g) - 0.5
    dy = torch.rand(2 * ROWS, FEATURES, generator=g) - 0.5
    x[ROWS:] *= 4  # rank 1's rows hold the larger amaxes
    dy[ROWS:] *= 4
    return x, dy


def _step(rank, world_size, device_type, reduce_amax):
    device = rank_device(rank, device_type)
    x, dy = (t[rank * ROWS : (rank + 1) * ROWS].to(device) for t in _data())
    torch.manual_seed(0)
    linear = te.ops.Linear(FEATURES, FEATURES, bias=False, device=device)
    recipe = DelayedScaling(fp8_format=Format.HYBRID, margin=MARGIN, amax_history_len=4, reduce_amax=reduce_amax)
    with te.autocast(recipe=recipe):
        y = linear(x)
    y.backward(dy)
    op = linear.basic_ops[0]
    weight_amax = op.weight.detach().abs().amax().cpu()
    return {mode: op._recipe_states[mode].scale.cpu() for mode in ("forward", "backward")} | {"w_amax": weight_amax}


def _scale(fmax: float, amax: torch.Tensor) -> torch.Tensor:
    return torch.tensor(fmax * 2.0 ** -MARGIN, dtype=torch.float32) / amax.float()


@pytest.fixture
def device_type(request) -> str:
    return torch.device(request.config.getoption("--device")).type


@pytest.mark.parametrize("reduce_amax", [True, False], ids=["reduce_amax", "no_reduce_amax"])
def test_delayed_scaling_reduces_amaxes_over_the_world_group_by_default(ranks, device_type, reduce_amax):
    results = ranks(_step, device_type, reduce_amax)
    x, dy = _data()
    for rank, out in enumerate(results):
        rows = slice(0, 2 * ROWS) if reduce_amax else slice(rank * ROWS, (rank + 1) * ROWS)
        x_amax, dy_amax = x[rows].abs().amax(), dy[rows].abs().amax()
        # Both ranks hold the same weight (same seed): its amax is the same with or without reduction.
        assert torch.equal(out["forward"][0], _scale(448.0, x_amax)), (rank, out)
        assert torch.equal(out["forward"][1], _scale(448.0, out["w_amax"])), (rank, out)
        assert torch.equal(out["backward"][0], _scale(57344.0, dy_amax)), (rank, out)
    if reduce_amax:
        assert all(torch.equal(results[0][m], results[1][m]) for m in ("forward", "backward"))
    else:  # each rank's own amaxes: rank 1's inputs are 4x larger, so its scales are smaller
        assert not torch.equal(results[0]["forward"], results[1]["forward"])
