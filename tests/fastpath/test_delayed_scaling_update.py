"""``delayed_scaling_update``: the fast path's one-launch recipe update against the reference's torch code, bit
for bit (history and scale), over special amaxes (0, NaN, inf, subnormals, FLT_MAX), both algorithms, history
lengths 1, 2, 16, 257, 258, 513 and 1024 (the kernel shifts 256 rows at a time), margins and formats, with
``amax`` as history's own row 0 (in place) or a separate (all-reduced) tensor; and a training step's recipe
updates through it (one launch each)."""

from __future__ import annotations

import itertools

import pytest
import torch

import refops
from refops.formats import FLT_MAX

SPECIAL = [0.0, -0.0, float("nan"), float("inf"), 1e-45, 3e-39, 1e-38, 1e-30, 0.5, 1.0, 448.0, 3.0e38, FLT_MAX, 7.25]


def _state(length: int, n: int, seed: int, device):
    g = torch.Generator().manual_seed(seed)
    values = torch.tensor(SPECIAL, dtype=torch.float32)
    pick = values[torch.randint(0, len(SPECIAL), (length, n), generator=g)]
    rand = torch.rand(length, n, generator=g) * 2.0 ** torch.randint(-140, 128, (length, n), generator=g).float()
    history = torch.where(torch.rand(length, n, generator=g) < 0.5, pick, rand)
    scale = torch.where(torch.rand(n, generator=g) < 0.2, values[torch.randint(0, len(SPECIAL), (n,), generator=g)],
                        torch.rand(n, generator=g) * 100)
    return history.to(device), scale.to(device)


@pytest.mark.parametrize("algorithm,length,n,numerator,separate_amax", [
    (a, L, n, num, sep) for (a, L, n), num, sep in itertools.product(
        [("max", 1, 40), ("max", 2, 40), ("max", 16, 3), ("max", 1024, 300), ("most_recent", 1, 40),
         ("most_recent", 16, 40), ("most_recent", 1024, 3),
         ("max", 257, 5), ("max", 513, 2), ("most_recent", 258, 5)],  # the kernel's 256-row chunks, plus one
        [448.0, 448.0 * 2.0 ** -3, 57344.0, 0.1], [False, True])
])
def test_fastpath_update_matches_the_reference_bit_for_bit(algorithm, length, n, numerator, separate_amax, cuda,
                                                           reference_backend, fastpath_backend):
    history, scale = _state(length, n, seed=length * 7 + n, device=cuda)
    g = torch.Generator().manual_seed(n)
    fresh_amaxes = []  # the next steps' amaxes, the same for both backends: some slots unused (0), some NaN
    for _ in range(2):
        fresh = torch.rand(n, generator=g) * 10
        fresh[::5] = 0.0
        fresh[1::7] = float("nan")
        fresh_amaxes.append(fresh.to(cuda))
    results = []
    for backend in (reference_backend, fastpath_backend):
        h, s = history.clone(), scale.clone()
        amax = h[0].clone() * 1.5 if separate_amax else h[0]
        for step in range(3):
            with refops.use_backend(backend) as kernels:
                kernels.delayed_scaling_update(h, s, amax, numerator=numerator, algorithm=algorithm)
            if step < 2:
                h[0].copy_(fresh_amaxes[step])
                if separate_amax:
                    amax = fresh_amaxes[step] * 2
        results.append((h, s))
    (h_ref, s_ref), (h_fast, s_fast) = results
    assert torch.equal(h_fast.view(torch.int32), h_ref.view(torch.int32))
    assert torch.equal(s_fast.view(torch.int32), s_ref.view(torch.int32))


def test_training_step_recipe_update_is_one_launch_without_syncs(cuda, fastpath_backend, monkeypatch):
    import fastpath.quantize as fast_quantize

    launches = []
    real_run = fast_quantize._run
    monkeypatch.setattr(fast_quantize, "_run", lambda f, name, *a: launches.append(name) or real_run(f, name, *a))
    model = refops.ops.Sequential(refops.ops.Linear(128, 256, device=cuda, dtype=torch.bfloat16), refops.ops.GELU(),
                                  refops.ops.Linear(256, 128, device=cuda, dtype=torch.bfloat16))
    x = torch.randn(64, 128, device=cuda, dtype=torch.bfloat16, requires_grad=True)
    recipe = refops.recipe.DelayedScaling()

    def step():
        with refops.use_backend(fastpath_backend):
            with refops.autocast(recipe=recipe):
                y = model(x)
            y.float().sum().backward()

    step()  # compiles, builds the states
    torch.cuda.synchronize()
    launches.clear()
    step()
    torch.cuda.synchronize()
    assert launches.count("fp8_delayed_scaling_update") == 4, launches  # forward and backward state of each op


def _kernel_port(h, s, a, numerator: float, algo_max: bool) -> None:
    """``fp8_delayed_scaling_update`` (cast_fp8.cu) step for step in numpy fp32 (IEEE, subnormals kept); the
    kernel folds the history in a tree of fmaxf from 0, which gives the same value as this sequential fold."""
    import numpy as np

    length, n = h.shape
    num = np.float32(numerator)
    for i in range(n):
        a0 = a[i]
        if a0 == np.float32(0):
            continue
        m = a0
        if algo_max:
            m = np.float32(0)
            for j in range(1, length):
                m = np.fmax(m, h[j, i])
            m = np.fmax(m, a0)
        for j in range(1, length - 1):
            h[j, i] = h[j + 1, i]
        if length > 1:
            h[length - 1, i] = a0
        h[0, i] = 0
        if np.isfinite(m) and m > 0:
            with np.errstate(all="ignore"):
                q = np.float32(num / m)
            s[i] = np.float32(np.finfo(np.float32).max) if np.isinf(q) else q


@pytest.mark.parametrize("algorithm,length,n", [("max", 1, 40), ("max", 2, 40), ("max", 16, 3), ("max", 64, 300),
                                                ("most_recent", 1, 40), ("most_recent", 16, 40)])
@pytest.mark.parametrize("numerator", [448.0, 56.0, 57344.0, 0.1])
@pytest.mark.parametrize("separate_amax", [False, True])
def test_the_kernels_algorithm_matches_the_reference_on_the_cpu(algorithm, length, n, numerator, separate_amax):
    """Runs without a GPU: the kernel's steps (a numpy port) against the reference, bit for bit."""
    from refops.kernels.reference.delayed_scaling import delayed_scaling_update

    history, scale = _state(length, n, seed=length * 7 + n, device="cpu")
    h_ref, s_ref = history.clone(), scale.clone()
    delayed_scaling_update(h_ref, s_ref, h_ref[0].clone() * 1.5 if separate_amax else h_ref[0], numerator=numerator,
                           algorithm=algorithm)
    h, s = history.numpy().copy(), scale.numpy().copy()
    _kernel_port(h, s, (history[0] * 1.5).numpy() if separate_amax else h[0], numerator, algorithm == "max")
    assert torch.equal(h_ref.view(torch.int32), torch.from_numpy(h).view(torch.int32))
    assert torch.equal(s_ref.view(torch.int32), torch.from_numpy(s).view(torch.int32))
