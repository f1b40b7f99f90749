"""The run's time budget (``--budget-s``) and each item's expected time.

A row starts only when its expected time fits in what is left of the budget; a row that does not fit is listed in
the record as not run (``vs_te_meta.json``'s ``not_run``, the end of ``vs_te.md``) and the run goes on to the next
ones, which may be shorter. The records are written after every row, so a run the budget stops, or a ``timeout``
kills, keeps what it measured. The expected times are :func:`estimate_s`'s model, scaled by what the rows of the
same kind actually took so far in this run (:meth:`Budget.observe`).

The model, from the records of 2026-12-05 (``benchmarks/results/2026-12-05-h100-vs-te/``, H100, TE 2.20.2): a step
at 8192 tokens takes 10 ms in bf16 and 5.6-7.5 ms under FP8 (650 and 880-1170 TFLOP/s), and refops's eager step
needs 2.6 (bf16) to 4.5 ms (FP8) of host time, TE's 1.9-3.0, so a step is ``max(host, FLOP / rate)``; a replayed
graph needs well under a millisecond of host time. Each side of a row makes ``warmup + reps + host_calls +
device_reps`` calls, 2 more for the SQNR check and the kernel profile, 13 more with ``--host-profile``. A quantize
row against a ``torch.compile`` peer is dominated by the compile: run 47 (``h200-2026-12-03-run47/times.txt``)
compiled and timed four NVFP4 peers in 41 s. The fixed seconds per row (building and filling both models, the
captures, each ``torch.profiler`` pass, ``gc.collect`` and ``empty_cache``) are not in any record; they are set so
that the 10 rows of the 2026-12-05 record come to about 85 s, inside the 180 s (cold caches) and 140 s (warm) in
which ``perf_verify.sh`` ran them. Every record now keeps each row's seconds (``row_s``) to refine them.

By this model the default run (38 items) takes about 250 s (290 s with ``--host-profile``), the step rows alone
about 195 s, and the 8192- and 2048-token step rows with the host profile about 105 s.
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional

from .rows import Item, step_flops

#: Seconds before the first row: importing torch, refops, the fast path and TE, TE's first autocast.
STARTUP_S = 20.0
#: Seconds of a quantize row against TE, and against a torch.compile peer (its compile, cold caches).
QUANTIZE_TE_S = 3.0
QUANTIZE_COMPILE_S = 20.0
#: Fixed seconds of a step row: models built and filled, inputs, SQNR check, cache emptied; and what the graphs'
#: capture adds (two captures, three warm-up steps each), and each torch.profiler pass (kernels, host ops).
STEP_FIXED_S = 2.0
GRAPH_CAPTURE_S = 1.5
PROFILER_PASS_S = 0.5
#: Achieved TFLOP/s of a step by recipe (the 2026-12-05 record, eager TE at 8192 tokens).
STEP_TFLOPS = {None: 650.0, "fp8_current": 1070.0, "fp8_delayed": 1170.0, "fp8_block": 880.0}
#: Host ms of one eager step, the slower side (refops, 2026-12-05), and of one replayed graph.
EAGER_HOST_MS = {None: 2.6, "fp8_current": 4.3, "fp8_delayed": 4.4, "fp8_block": 4.6}
GRAPHED_HOST_MS = 0.5


def step_call_ms(item: Item) -> float:
    """Expected ms of one step call of ``item``: the slower of its host time and its device time."""
    device = step_flops(item.sizes) / (STEP_TFLOPS[item.row.recipe] * 1e12) * 1e3
    host = GRAPHED_HOST_MS if item.mode == "graphed" else EAGER_HOST_MS[item.row.recipe]
    return max(host, device)


def estimate_s(item: Item, *, reps: int = 20, warmup: int = 3, kernels: bool = True,
               host_profile: bool = False) -> float:
    """Expected seconds of ``item`` (both sides), by the model of the module docstring."""
    if item.row.kind == "quantize":
        return QUANTIZE_COMPILE_S if item.row.baseline == "compile" else QUANTIZE_TE_S
    graphed = item.mode == "graphed"
    host_calls = reps if graphed else 3
    device_reps = reps if graphed else min(reps, 5)
    calls = warmup + reps + host_calls + device_reps + 2 + (13 if host_profile else 0)
    fixed = STEP_FIXED_S + (GRAPH_CAPTURE_S if graphed else 0.0)
    fixed += PROFILER_PASS_S * ((2 if kernels else 0) + (2 if host_profile else 0))
    return fixed + 2 * calls * step_call_ms(item) / 1e3


def kind_of(item: Item) -> str:
    """The group whose measured times scale an item's estimate."""
    if item.row.kind == "quantize":
        return f"quantize-{item.row.baseline}"
    return f"step-{item.mode}"


@dataclasses.dataclass
class Budget:
    """``total_s`` seconds from ``start`` (default: the budget's creation; None or 0: no limit), on ``clock``."""

    total_s: Optional[float]
    clock: Callable[[], float] = time.monotonic
    start: Optional[float] = None
    _seen: dict = dataclasses.field(init=False, default_factory=dict)  # kind -> [estimated s, actual s]

    def __post_init__(self) -> None:
        if self.start is None:
            self.start = self.clock()
        if not self.total_s:
            self.total_s = None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return math.inf if self.total_s is None else self.total_s - self.elapsed()

    def factor(self, kind: str) -> float:
        """How much longer than estimated the rows of ``kind`` took so far (1 before any; within 0.5-4)."""
        est, actual = self._seen.get(kind, (0.0, 0.0))
        return 1.0 if est <= 0 else min(4.0, max(0.5, actual / est))

    def expected(self, kind: str, estimate: float) -> float:
        return estimate * self.factor(kind)

    def fits(self, kind: str, estimate: float) -> bool:
        """Whether a row of ``kind`` and ``estimate`` seconds is expected to end within the budget."""
        return self.expected(kind, estimate) <= self.left()

    def observe(self, kind: str, estimate: float, actual: float) -> None:
        seen = self._seen.setdefault(kind, [0.0, 0.0])
        seen[0] += estimate
        seen[1] += actual

    def reason(self, kind: str, estimate: float) -> str:
        return (f"budget: expected {self.expected(kind, estimate):.0f} s, {max(0.0, self.left()):.0f} s of "
                f"{self.total_s:.0f} s left")


def plan_seconds(plan: list[Item], **options: object) -> float:
    """The expected seconds of a whole plan (start-up included), without a budget."""
    return STARTUP_S + sum(estimate_s(item, **options) for item in plan)  # type: ignore[arg-type]
