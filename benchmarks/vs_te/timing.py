"""How a prepared call is timed: eager, device and host time (and host time per call, forward and backward apart).

Every time is the median of CUDA-event intervals between consecutive calls after warm-up:

* eager (:func:`eager_ms`): calls enqueued back to back on an idle GPU, as a training loop runs them. When the
  host takes longer to enqueue a call than the GPU takes to run it, this is host time.
* device (:func:`device_ms`): the same calls queued behind a GPU spin (``torch.cuda._sleep``) long enough for the
  host to queue all of them, so the intervals are device time without host gaps. A call that synchronizes the
  host with the device drains the queue: its device time stays eager.
* host (:func:`host_ms`): host wall time per call, no synchronization inside the loop.
* host per call (:func:`host_per_call`, ``--host-profile``): each call started on an idle GPU (synchronized before,
  not inside), so that no call waits for the GPU's queue; the step's forward and backward are timed apart.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any, Callable, Optional

import torch

from fastpath.benchmark.timing import event_intervals_ms


def sync() -> None:
    torch.cuda.synchronize()


def eager_ms(fn: Callable[[], Any], reps: int, warmup: int) -> float:
    """Median of ``reps`` event intervals of calls enqueued back to back on an idle GPU."""
    for _ in range(warmup):
        fn()
    sync()
    return statistics.median(event_intervals_ms(fn, reps))


def host_ms(fn: Callable[[], Any], calls: int) -> float:
    """Host wall milliseconds per call, no synchronization inside the loop (the GPU runs meanwhile)."""
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    elapsed = time.perf_counter() - start
    sync()
    return 1e3 * elapsed / calls


_SPIN_CYCLES_PER_MS: Optional[float] = None


def spin_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep`` (measured once)."""
    global _SPIN_CYCLES_PER_MS
    if _SPIN_CYCLES_PER_MS is None:
        cycles = 20_000_000
        torch.cuda._sleep(cycles)  # warm-up
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(cycles)
        end.record()
        end.synchronize()
        _SPIN_CYCLES_PER_MS = cycles / max(start.elapsed_time(end), 1e-3)
    return _SPIN_CYCLES_PER_MS


def device_ms(fn: Callable[[], Any], reps: int, host_ms_per_call: float) -> float:
    """Median of ``reps`` event intervals of calls queued behind a GPU spin that outlasts their enqueueing."""
    sync()
    spin_ms = 1.5 * host_ms_per_call * reps + 5.0
    torch.cuda._sleep(int(spin_ms * spin_cycles_per_ms()))
    return statistics.median(event_intervals_ms(fn, reps))


@dataclasses.dataclass
class Side:
    """A prepared call of one side (``fn``), how many calls its host time is the mean of, and at most how many
    calls its device time queues behind the spin: an eager training step launches ~100-250 kernels, and the GPU's
    launch queue holds about a thousand, so more steps than that would wait for the spin on the host (a replayed
    graph is a few launches: its steps need no such limit)."""

    fn: Callable[[], Any]
    host_calls: int
    device_reps: Optional[int] = None


def measure_side(side: Side, reps: int, warmup: int) -> dict[str, float]:
    eager = eager_ms(side.fn, reps, warmup)
    host = host_ms(side.fn, side.host_calls)
    device = device_ms(side.fn, min(reps, side.device_reps or reps), host)
    return {"ms": eager, "device_ms": device, "host_ms": host}


def host_per_call(fn: Callable[[], Any], calls: int, clock: Callable[[], float] = time.perf_counter,
                  synchronize: Optional[Callable[[], None]] = None) -> dict[str, float]:
    """Host milliseconds of each of ``calls`` calls, each started on an idle GPU: the median, min and max of the
    whole call, and (for a step made by ``vs_te.steps``, which records ``(forward_s, backward_s)`` in
    ``fn.phases`` while that is a list) the median of its forward and of its backward."""
    synchronize = synchronize or sync
    totals = []
    fn.phases = []  # type: ignore[attr-defined]
    try:
        for _ in range(calls):
            synchronize()
            start = clock()
            fn()
            totals.append(clock() - start)
        synchronize()
        phases = list(fn.phases)  # type: ignore[attr-defined]
    finally:
        fn.phases = None  # type: ignore[attr-defined]
    result = {"host_call_ms": 1e3 * statistics.median(totals), "host_call_min_ms": 1e3 * min(totals),
              "host_call_max_ms": 1e3 * max(totals)}
    if phases:
        result["host_fwd_ms"] = 1e3 * statistics.median(p[0] for p in phases)
        result["host_bwd_ms"] = 1e3 * statistics.median(p[1] for p in phases)
    return result
