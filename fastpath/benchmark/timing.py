"""Timing with CUDA events, and counting the bytes a kernel call must move.

Method (``docs/benchmarks.md#methodology``): warm up first (never time the first call: it
compiles), then enqueue ``reps`` calls back to back with an event between
consecutive calls, synchronize once, and report the median. The host enqueues
ahead of the GPU, so the times are device times without host gaps. Tensors of
256 MiB are far larger than the L2 cache, so no flush is needed between calls.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Iterable

import torch

__all__ = ["event_intervals_ms", "median_ms", "tensors_in", "unique_bytes"]


def median_ms(fn: Callable[[], Any], *, warmup: int = 2, reps: int = 20, slow_call_s: float = 0.1,
              slow_reps: int = 3) -> tuple[float, int]:
    """``(median milliseconds, reps timed)`` of ``fn()`` on the current stream.

    A call slower than ``slow_call_s`` (a reference fallback on a large tensor)
    is timed only ``slow_reps`` times, to keep the whole run short.
    """
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    if time.perf_counter() - start > slow_call_s:
        warmup, reps = 0, slow_reps
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_intervals_ms(fn, reps)), reps


def event_intervals_ms(fn: Callable[[], Any], reps: int) -> list[float]:
    """The milliseconds between CUDA events recorded around each of ``reps`` calls enqueued back to back."""
    events = [torch.cuda.Event(enable_timing=True) for _ in range(reps + 1)]
    events[0].record()
    for i in range(reps):
        fn()
        events[i + 1].record()
    events[-1].synchronize()
    return [events[i].elapsed_time(events[i + 1]) for i in range(reps)]


def tensors_in(value: Any) -> Iterable[torch.Tensor]:
    """Every plain tensor in a (nested) tuple/list/dict; quantized tensors contribute their arrays."""
    if isinstance(value, torch.Tensor):
        plain = getattr(value, "to_plain_tensors", None)
        if callable(plain):  # a refops QuantizedTensor: its storage is its arrays
            arrays, _ = plain()
            yield from (t for t in arrays.values() if isinstance(t, torch.Tensor))
        else:
            yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tensors_in(item)


def unique_bytes(*values: Any, exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages among the tensors in ``values`` (minus ``exclude``'s)."""
    skip = {t.data_ptr() for t in exclude}
    seen: dict[int, int] = {}
    for t in tensors_in(values):
        if t.data_ptr() in skip or t.numel() == 0:
            continue
        seen[t.data_ptr()] = max(seen.get(t.data_ptr(), 0), t.numel() * t.element_size())
    return sum(seen.values())
