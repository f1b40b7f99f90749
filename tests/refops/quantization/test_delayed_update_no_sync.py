"""The delayed-scaling recipe update (``DelayedScalingRecipeState.update_scales``) on the training hot path.

It runs four times per training step of a Linear pair (forward and backward state of each op), so it must
not read anything back to the host nor copy a Python value to the device (``torch.tensor(v, device=cuda)``
is a blocking host-to-device copy): each is a stream sync. And its numbers must stay what they were when
the numerator was such a copied tensor (issue #27): bit for bit, over special amaxes, margins, formats,
algorithms and history lengths.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from refops.quantization.recipe_state import FLT_MAX, DelayedScalingRecipeState, _nan_skipping_max
from refops.recipe import DelayedScaling, Format

SPECIAL = [0.0, float("nan"), float("inf"), 1e-45, 1e-38, 3e-39, 1e-30, 0.5, 1.0, 448.0, 3.0e38, FLT_MAX, 7.25]


def _old_update(state: DelayedScalingRecipeState) -> None:
    """update_scales as it was before issue #27 (numerator by ``torch.tensor(..., device=)``), fused path only."""
    recipe = state.recipe
    history = state.amax_history
    a0 = history[0].clone()
    used = a0 != 0
    rolled = torch.zeros_like(history)
    if history.shape[0] > 1:
        rolled[1:-1] = history[2:]
        rolled[-1] = a0
    if recipe.amax_compute_algo == "max":
        amax = _nan_skipping_max(torch.cat([history[1:], a0.unsqueeze(0)]))
    else:
        amax = a0
    numerator = torch.tensor(state.fmax * 2.0 ** (-recipe.margin), dtype=torch.float32, device=amax.device)
    scale = numerator / amax
    scale = torch.where(torch.isinf(scale), torch.full_like(scale, FLT_MAX), scale)
    valid = torch.isfinite(amax) & (amax > 0)
    new_scale = torch.where(valid, scale, state.scale)
    history.copy_(torch.where(used, rolled, history))
    state.scale.copy_(torch.where(used, new_scale, state.scale))


def _states(recipe: DelayedScaling, mode: str, n: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    new = DelayedScalingRecipeState(recipe, mode=mode, num_quantizers=n, device=torch.device("cpu"))
    old = DelayedScalingRecipeState(recipe, mode=mode, num_quantizers=n, device=torch.device("cpu"))
    values = torch.tensor(SPECIAL, dtype=torch.float32)
    picks = torch.randint(0, len(SPECIAL), new.amax_history.shape, generator=gen)
    random = torch.rand(new.amax_history.shape, generator=gen) * 2.0 ** torch.randint(-40, 40, new.amax_history.shape,
                                                                                     generator=gen)
    history = torch.where(torch.rand(new.amax_history.shape, generator=gen) < 0.5, values[picks], random)
    scale = torch.rand(n, generator=gen) * 100
    for s in (new, old):
        s.amax_history.copy_(history)
        s.scale.copy_(scale)
    return new, old


@pytest.mark.parametrize(
    "margin,fmt,algo,length,mode",
    list(itertools.product((0, 1, 3), (Format.E4M3, Format.HYBRID), ("max", "most_recent"), (1, 2, 16),
                           ("forward", "backward"))),
)
def test_update_scales_bit_identical_to_the_copied_numerator(margin, fmt, algo, length, mode):
    recipe = DelayedScaling(margin=margin, fp8_format=fmt, amax_compute_algo=algo, amax_history_len=length)
    n = 3 * len(SPECIAL)
    new, old = _states(recipe, mode, n, seed=margin * 100 + length)
    for _ in range(3):  # several updates: rolled histories feed the next scale
        new.update_scales()
        _old_update(old)
        assert torch.equal(new.amax_history.view(torch.int32), old.amax_history.view(torch.int32))
        assert torch.equal(new.scale.view(torch.int32), old.scale.view(torch.int32))
        new.amax_history[0].copy_(old.amax_history[0].uniform_(0, 10))  # a fresh step's amaxes


class _HostRead(AssertionError):
    pass


def _refuse(name):
    def refuse(*args, **kwargs):
        raise _HostRead(f"{name} on the delayed-scaling update path (a host sync on a GPU)")
    return refuse


@pytest.mark.parametrize("algo", ("max", "most_recent"))
def test_update_scales_reads_nothing_back_and_copies_no_python_value(monkeypatch, algo):
    recipe = DelayedScaling(amax_compute_algo=algo, amax_history_len=8)
    state, old = _states(recipe, "forward", 6, seed=1)
    for _ in range(2):
        _old_update(old)
    with monkeypatch.context() as patched:
        for name in ("item", "tolist", "cpu", "__bool__", "__float__", "__int__", "__index__"):
            patched.setattr(torch.Tensor, name, _refuse(f"Tensor.{name}"))
        patched.setattr(torch, "tensor", _refuse("torch.tensor"))
        patched.setattr(torch, "as_tensor", _refuse("torch.as_tensor"))
        state.update_scales()
        state.update_scales()
    assert torch.equal(state.scale.view(torch.int32), old.scale.view(torch.int32)), "the update still updates"
    assert torch.equal(state.amax_history.view(torch.int32), old.amax_history.view(torch.int32))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.set_sync_debug_mode)")
def test_update_scales_never_syncs_on_cuda():
    recipe = DelayedScaling(amax_history_len=16)
    state = DelayedScalingRecipeState(recipe, mode="forward", num_quantizers=3, device=torch.device("cuda"))
    state.amax_history.uniform_(0, 4)
    twin = DelayedScalingRecipeState(recipe, mode="forward", num_quantizers=3, device=torch.device("cpu"))
    twin.amax_history.copy_(state.amax_history.cpu())
    state.update_scales()  # first call: lazy initialisation is allowed to sync
    twin.update_scales()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            state.update_scales()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    for _ in range(3):
        twin.update_scales()
    assert torch.equal(state.scale.cpu().view(torch.int32), twin.scale.view(torch.int32)), "same scales as on the CPU"
