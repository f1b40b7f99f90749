"""Why the fast path cannot run, as the skips of its tests say it: the real cause first (issue #37: on machines
without a GPU, thousands of skips said to install CuPy, which would not have helped)."""

from __future__ import annotations

import sys

import torch

from fastpath.availability import unavailable_reason

reason = unavailable_reason.__wrapped__  # uncached: each case sets up its own machine


def test_without_a_gpu_the_reason_is_the_gpu_not_cupy(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setitem(sys.modules, "cupy", None)  # CuPy missing too: still not the reason to give
    monkeypatch.setattr(torch.version, "cuda", None)
    cpu_build = reason()
    assert cpu_build.startswith("no CUDA GPU: this torch (") and "CPU-only build" in cpu_build
    assert "CuPy" not in cpu_build and "extra" not in cpu_build
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    cuda_build = reason()
    assert cuda_build == "no CUDA GPU on this machine (torch sees none); the fast path needs one"


def test_with_a_gpu_and_no_cupy_the_reason_is_cupy(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "cupy", None)
    said = reason()
    assert said.startswith("CuPy is not installed") and "cuda12 or cuda13 extra" in said
