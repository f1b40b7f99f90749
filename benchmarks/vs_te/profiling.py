"""What one call does, beyond its time: the kernels it launched and its host-device syncs (``torch.profiler`` with
CUPTI), refops's fast-path launches counted in Python, a cProfile of refops's host time (``--profile``), and a
CPU-only ``torch.profiler`` table of either side's host time by op (``--host-profile``)."""

from __future__ import annotations

import contextlib
import pathlib
import sys
from typing import Any, Callable, Optional

from . import timing


@contextlib.contextmanager
def counting_fastpath_launches(counter: list[int]):
    """Count the fast path's kernel launches (``fastpath._cuda.launch`` and the modules that bound it by name)."""
    patched = []
    try:
        import fastpath._cuda as cuda_module
    except Exception:  # a tree without fastpath: nothing to count
        yield
        return
    real = cuda_module.launch

    def counted(*args: Any, **kwargs: Any) -> Any:
        counter[0] += 1
        return real(*args, **kwargs)

    for name, module in list(sys.modules.items()):
        if (name == "fastpath" or name.startswith("fastpath.")) and getattr(module, "launch", None) is real:
            setattr(module, "launch", counted)
            patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            setattr(module, "launch", real)


def profile_call(fn: Callable[[], Any], path: Optional[pathlib.Path]) -> dict[str, Any]:
    """Kernels launched and host-device synchronizations of one call, by ``torch.profiler`` (CUPTI)."""
    from torch.profiler import ProfilerActivity, profile

    timing.sync()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        timing.sync()
    kernels: dict[str, list[float]] = {}
    syncs = 0
    for evt in prof.events():
        name = evt.name
        device_type = str(getattr(evt, "device_type", ""))
        if device_type.endswith("CUDA"):
            us = getattr(evt, "self_device_time_total", None)
            if us is None:
                us = getattr(evt, "self_cuda_time_total", 0.0)
            kernels.setdefault(name, []).append(float(us))
        elif name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"):
            syncs += 1
    # The closing torch.cuda.synchronize() above is ours, not the call's.
    syncs = max(0, syncs - 1)
    total = sum(len(v) for v in kernels.values())
    if path is not None:
        rows = sorted(kernels.items(), key=lambda kv: -sum(kv[1]))
        lines = [f"{total} device activities (kernels, copies, memsets), {syncs} host-device syncs in one call",
                 f"{'us total':>10} {'count':>6}  name"]
        lines += [f"{sum(v):10.1f} {len(v):6d}  {n[:160]}" for n, v in rows]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(lines) + "\n")
    return {"kernels": total, "syncs": syncs}


def cprofile(fn: Callable[[], Any], path: pathlib.Path, calls: int = 20) -> None:
    """The host time of ``calls`` calls by function (cProfile), top 40 by self time."""
    import cProfile
    import io
    import pstats

    timing.sync()
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        fn()
    profiler.disable()
    timing.sync()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(40)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{calls} calls\n" + stream.getvalue())


def host_op_table(fn: Callable[[], Any], path: pathlib.Path, calls: int = 3, rows: int = 30) -> None:
    """``calls`` calls under a CPU-only ``torch.profiler``: the ops by self CPU time (host time by op, either side),
    each call started on an idle GPU."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(calls):
            timing.sync()
            fn()
        timing.sync()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{calls} calls, CPU-only torch.profiler, by self CPU time\n{table}\n")
