"""Parts (b) and (c): LayerNorm -> Linear -> GELU -> Linear, device time per step and host time per forward.

(b) forward + backward of the full-size pipeline under each recipe, timed with
CUDA events, with the GEMM path each recipe takes (``fastpath.gemm.GEMM_PATHS``)
and the ``torch._scaled_mm`` calls actually made per step.
(c) the same pipeline at a tiny size, where the GPU work is negligible: CPU time
per fuser forward (no synchronization inside the loop; the median of batches),
a cProfile breakdown of where that time goes, and a probe of the machine's own
host speed (torch's allocation and dispatch of small tensors), since host times
of the same code move by 2x between machine instances.
"""

from __future__ import annotations

import contextlib
import cProfile
import dataclasses
import pstats
import statistics
import time
from typing import Any, Callable, Iterator, Optional

import torch

import refops
import refops as te
from refops.ops.basic.activation import GELU
from refops.ops.basic.layer_norm import LayerNorm
from refops.ops.sequential import Sequential
from refops.recipe import (
    DelayedScaling,
    Float8BlockScaling,
    Float8CurrentScaling,
    MXFP8BlockScaling,
    NVFP4BlockScaling,
)

from ..gemm import GEMM_PATHS
from .timing import median_ms

__all__ = ["PIPELINE_CASES", "HOST_CASES", "measure_pipeline", "measure_host", "host_speed_probe_us",
           "median_of_batches"]

#: (label, backend, recipe class or None, GEMM_PATHS key)
PIPELINE_CASES = [
    ("fastpath, Float8CurrentScaling", "fastpath", Float8CurrentScaling, "fp8_current_scaling"),
    ("reference, Float8CurrentScaling", "reference", Float8CurrentScaling, "fp8_current_scaling"),
    ("fastpath, bf16 (no quantization)", "fastpath", None, "none"),
    ("fastpath, DelayedScaling", "fastpath", DelayedScaling, "fp8_delayed_scaling"),
    ("fastpath, MXFP8BlockScaling", "fastpath", MXFP8BlockScaling, "mxfp8"),
    ("fastpath, Float8BlockScaling", "fastpath", Float8BlockScaling, "fp8_block_scaling"),
    ("fastpath, NVFP4BlockScaling", "fastpath", NVFP4BlockScaling, "nvfp4"),
]
HOST_CASES = [
    ("fastpath, bf16 (no quantization)", "fastpath", None),
    ("fastpath, Float8CurrentScaling", "fastpath", Float8CurrentScaling),
    ("reference, bf16 (no quantization)", "reference", None),
]


def build_pipeline(hidden: int, ffn: int, dtype: torch.dtype, device: torch.device) -> Sequential:
    return Sequential(
        LayerNorm(hidden, device=device, dtype=dtype),
        te.ops.Linear(hidden, ffn, device=device, dtype=dtype),
        GELU(),
        te.ops.Linear(ffn, hidden, device=device, dtype=dtype),
    )


@contextlib.contextmanager
def counting_scaled_mm(counter: list[int]) -> Iterator[None]:
    """Count calls of ``torch._scaled_mm`` (the fast path's FP8 GEMM) for the duration."""
    real = torch._scaled_mm

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return real(*args, **kwargs)

    torch._scaled_mm = wrapper
    try:
        yield
    finally:
        torch._scaled_mm = real


def _context(backend: str, recipe: Optional[Any]):
    stack = contextlib.ExitStack()
    stack.enter_context(refops.use_backend(backend))
    stack.enter_context(te.autocast(enabled=recipe is not None, recipe=recipe))
    return stack


@dataclasses.dataclass
class PipelineResult:
    label: str
    backend: str
    recipe: str
    gemm_path: str
    gemm_reason: str
    scaled_mm_calls_per_step: int
    ms: float
    reps: int
    tflops: float


def measure_pipeline(label: str, backend: str, recipe_cls: Optional[type], path_key: str, *, tokens: int,
                     hidden: int, ffn: int, reps: int, device: torch.device) -> PipelineResult:
    torch.manual_seed(0)
    model = build_pipeline(hidden, ffn, torch.bfloat16, device)
    recipe = recipe_cls() if recipe_cls is not None else None
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device, requires_grad=True)
    dy = torch.randn(tokens, hidden, dtype=torch.bfloat16, device=device) * 0.1

    def step() -> None:
        model.zero_grad(set_to_none=True)
        x.grad = None
        with _context(backend, recipe):
            y = model(x)
        y.backward(dy)

    calls = [0]
    with counting_scaled_mm(calls):
        step()
    torch.cuda.synchronize()
    ms, timed = median_ms(step, warmup=1, reps=reps, slow_call_s=3.0, slow_reps=2)
    flops = 6 * 2 * tokens * hidden * ffn  # fprop, dgrad and wgrad of two linears
    path = GEMM_PATHS[path_key]
    return PipelineResult(label, backend, type(recipe).__name__ if recipe else "none", path.path, path.reason,
                          calls[0], ms, timed, flops / (ms * 1e-3) / 1e12)


# -------------------------------------------------------------- host time
@dataclasses.dataclass
class HostResult:
    label: str
    us_per_forward: float  # the median over batches of a batch's mean
    forwards: int
    top_functions: list[dict[str, Any]]
    by_area: dict[str, float]
    spread_pct: float = 0.0  # (slowest batch - fastest batch) / median, in percent
    batches: int = 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_of_batches(fn: Callable[[], Any], calls: int, batches: int) -> tuple[float, float]:
    """Median over ``batches`` batches of the mean microseconds per ``fn()`` call, and the batches' spread in %."""
    per_batch = max(1, calls // batches)
    means = []
    for _ in range(batches):
        start = time.perf_counter()
        for _ in range(per_batch):
            fn()
        means.append(1e6 * (time.perf_counter() - start) / per_batch)
    mid = statistics.median(means)
    return mid, 100.0 * (max(means) - min(means)) / mid


def host_speed_probe_us(device: torch.device, calls: int = 2000, batches: int = 5) -> float:
    """Microseconds for a fixed piece of host work: allocate two small tensors on ``device`` and add them.

    It involves no refops code, so it tells how fast this machine runs torch's allocator and dispatcher, which
    the fuser's forward leans on; host times of different runs compare through it.
    """
    def work() -> torch.Tensor:
        a = torch.empty(32, 64, dtype=torch.bfloat16, device=device)
        return torch.add(a, torch.empty_like(a))

    for _ in range(50):
        work()
    _sync(device)
    us, _ = median_of_batches(work, calls, batches)
    _sync(device)
    return us


def _area(filename: str, func: str) -> str:
    """Where a profiled function's self time belongs: a refops/fastpath package, CuPy, torch, ..."""
    path = filename.replace("\\", "/")
    for key in ("refops/ops", "refops/quantization", "refops/kernels", "fastpath", "torch", "cupy"):
        if f"/{key}/" in path:
            return key
    if filename == "~":  # a C function: name its library
        if "cupy" in func:
            return "cupy (C: kernel launches)"
        if "torch" in func or "Tensor" in func:
            return "torch (C: ops, allocations)"
        return "builtins"
    return "other Python"


def measure_host(label: str, backend: str, recipe_cls: Optional[type], *, device: torch.device,
                 forwards: int = 300, batches: int = 5, profiled: int = 100, top: int = 15) -> HostResult:
    """CPU time per forward of a tiny pipeline (GPU work negligible), and its cProfile breakdown."""
    torch.manual_seed(0)
    model = build_pipeline(64, 256, torch.bfloat16, device)
    recipe = recipe_cls() if recipe_cls is not None else None
    x = torch.randn(32, 64, dtype=torch.bfloat16, device=device, requires_grad=True)

    def forward() -> torch.Tensor:
        with _context(backend, recipe):
            return model(x)

    for _ in range(20):  # compile kernels, build the fuser
        forward()
    _sync(device)
    us_per_forward, spread = median_of_batches(forward, forwards, batches)
    _sync(device)

    profile = cProfile.Profile()
    profile.enable()
    for _ in range(profiled):
        forward()
    profile.disable()
    _sync(device)
    stats = pstats.Stats(profile)
    rows = []
    by_area: dict[str, float] = {}
    for (filename, line, func), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        area = _area(filename, func)
        by_area[area] = by_area.get(area, 0.0) + tottime
        rows.append({"function": f"{filename.split('site-packages/')[-1]}:{line}({func})", "area": area,
                     "calls_per_forward": ncalls / profiled, "us_self_per_forward": 1e6 * tottime / profiled,
                     "us_cumulative_per_forward": 1e6 * cumtime / profiled})
    rows.sort(key=lambda r: -r["us_self_per_forward"])
    per_forward = {k: round(1e6 * v / profiled, 1) for k, v in sorted(by_area.items(), key=lambda kv: -kv[1])}
    return HostResult(label, us_per_forward, forwards, rows[:top], per_forward, spread, batches)


def run_pipeline_cases(log: Callable[[str], None], **sizes: Any) -> list[PipelineResult]:
    results = []
    for label, backend, recipe_cls, key in PIPELINE_CASES:
        try:
            result = measure_pipeline(label, backend, recipe_cls, key, **sizes)
        except Exception as exc:
            log(f"  {label}: FAILED ({type(exc).__name__}: {exc})")
            continue
        finally:
            torch.cuda.empty_cache()
        log(f"  {label:<36} {result.ms:9.2f} ms/step {result.tflops:7.1f} TFLOP/s  GEMM: {result.gemm_path} "
            f"({result.scaled_mm_calls_per_step} _scaled_mm/step)")
        results.append(result)
    return results


def run_host_cases(log: Callable[[str], None], device: torch.device) -> list[HostResult]:
    results = []
    for label, backend, recipe_cls in HOST_CASES:
        try:
            result = measure_host(label, backend, recipe_cls, device=device)
        except Exception as exc:
            log(f"  {label}: FAILED ({type(exc).__name__}: {exc})")
            continue
        log(f"  {label:<36} {result.us_per_forward:8.1f} us/forward (batches spread {result.spread_pct:.0f} %); "
            f"self time by area: {result.by_area}")
        results.append(result)
    return results
