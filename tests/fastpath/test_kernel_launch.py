"""``fastpath._cuda.launch`` on any machine: a fake kernel and a fake CuPy driver stand in for the GPU.

A kernel whose static and dynamic shared memory pass 48 KiB together must opt in, on every loaded copy of it:
- GPU run 31 failed 18 tests after another test cleared the kernel caches, because the opt-in was remembered by
  kernel name;
- GPU run 33 failed 21 tests of LayerNorm backward in fp32, which takes exactly 48 KiB of dynamic shared memory beside
  256 bytes of static: the opt-in was then only asked for above 48 KiB of dynamic shared memory.
So every kernel with dynamic shared memory opts in, to the largest size asked of it. The GPU side of this is
``test_norms_differential.py``: ``test_layer_norm`` in fp32 and
``test_layer_norm_backward_after_its_kernel_is_loaded_again``.
"""

from __future__ import annotations

import sys
import types

import torch

from fastpath import _cuda

OPT_IN_ATTRIBUTE = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


class FakeKernel:
    """What ``launch`` uses of a loaded kernel: its handle (``ptr``) and the call; records each launch's shared
    memory."""

    def __init__(self, ptr: int) -> None:
        self.ptr = ptr
        self.launches: list[int] = []

    def __call__(self, grid, block, args, *, shared_mem, stream) -> None:
        self.launches.append(shared_mem)


def _fake_driver(monkeypatch) -> list:
    """A CuPy whose driver records ``funcSetAttribute`` calls; torch's device and stream queries answered for
    device 0."""
    calls: list = []

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    driver = types.ModuleType("cupy.cuda.driver")
    driver.funcSetAttribute = lambda ptr, attribute, value: calls.append((ptr, attribute, value))
    cuda = types.ModuleType("cupy.cuda")
    cuda.driver, cuda.Device = driver, Device
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    for name, module in (("cupy", cupy), ("cupy.cuda", cuda), ("cupy.cuda.driver", driver)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(_cuda, "_current_device", lambda: 0)
    monkeypatch.setattr(_cuda, "_raw_stream", lambda index: 0xC0FFEE)
    return calls


def test_launch_opts_each_loaded_kernel_in_to_the_largest_size_asked(monkeypatch):
    calls = _fake_driver(monkeypatch)
    monkeypatch.setattr(_cuda, "_dynamic_shared_allowed", {})
    first, reloaded, fp32_form = FakeKernel(0x1000), FakeKernel(0x2000), FakeKernel(0x3000)
    cuda0 = torch.device("cuda", 0)
    for shared in (96 * 1024, 96 * 1024, 16 * 1024, 48 * 1024, 0, 112 * 1024):
        _cuda.launch(first, (1,), (256,), (), device=cuda0, shared_mem=shared)
    _cuda.launch(reloaded, (1,), (256,), (), device=cuda0, shared_mem=96 * 1024)
    _cuda.launch(fp32_form, (1,), (256,), (), device=cuda0, shared_mem=48 * 1024)
    _cuda.launch(FakeKernel(0x4000), (1,), (256,), (), device=cuda0, shared_mem=0)
    assert first.launches == [96 * 1024, 96 * 1024, 16 * 1024, 48 * 1024, 0, 112 * 1024]
    assert reloaded.launches == [96 * 1024] and fp32_form.launches == [48 * 1024]
    # once per loaded kernel and larger size, never lowered; a kernel loaded again opts in again; 48 KiB of dynamic
    # shared memory opts in too (static shared memory counts against the same limit); none without dynamic shared
    assert calls == [(0x1000, OPT_IN_ATTRIBUTE, 96 * 1024), (0x1000, OPT_IN_ATTRIBUTE, 112 * 1024),
                     (0x2000, OPT_IN_ATTRIBUTE, 96 * 1024), (0x3000, OPT_IN_ATTRIBUTE, 48 * 1024)]


def test_resident_blocks_falls_back_without_the_occupancy_query(monkeypatch):
    """An older CuPy without ``occupancyMaxActiveBlocksPerMultiprocessor``: the caller's estimate per SM."""
    _fake_driver(monkeypatch)  # its driver has no occupancy query
    monkeypatch.setattr(_cuda, "sm_count", lambda index: 132)
    _cuda.resident_blocks.cache_clear()
    try:
        assert _cuda.resident_blocks(FakeKernel(0x1000), 0, 256, fallback_per_sm=3) == 3 * 132
    finally:
        _cuda.resident_blocks.cache_clear()


def test_resident_blocks_opts_in_before_the_occupancy_query(monkeypatch):
    """The occupancy of a kernel with dynamic shared memory is queried after its opt-in."""
    calls = _fake_driver(monkeypatch)
    driver = sys.modules["cupy.cuda.driver"]
    driver.occupancyMaxActiveBlocksPerMultiprocessor = lambda ptr, threads, shared: calls.append(
        ("occupancy", ptr, threads, shared)) or 2
    monkeypatch.setattr(_cuda, "sm_count", lambda index: 132)
    monkeypatch.setattr(_cuda, "_dynamic_shared_allowed", {})
    _cuda.resident_blocks.cache_clear()
    try:
        wave = _cuda.resident_blocks(FakeKernel(0x3000), 0, 256, 96 * 1024, fallback_per_sm=1)
        small_kernel = FakeKernel(0x4000)
        small = _cuda.resident_blocks(small_kernel, 0, 256, 16 * 1024, fallback_per_sm=1)
        again = _cuda.resident_blocks(small_kernel, 0, 256, 16 * 1024, fallback_per_sm=1)
        none = _cuda.resident_blocks(FakeKernel(0x5000), 0, 256, fallback_per_sm=1)
    finally:
        _cuda.resident_blocks.cache_clear()
    assert (wave, small, again, none) == (2 * 132,) * 4
    # one query per loaded kernel and shape (the second call for the same kernel is answered from the cache), each
    # after the kernel's opt-in where it takes dynamic shared memory
    assert calls == [(0x3000, OPT_IN_ATTRIBUTE, 96 * 1024), ("occupancy", 0x3000, 256, 96 * 1024),
                     (0x4000, OPT_IN_ATTRIBUTE, 16 * 1024), ("occupancy", 0x4000, 256, 16 * 1024),
                     ("occupancy", 0x5000, 256, 0)]
