"""Host time per fuser forward and per training step on a GPU, eager and replayed from a CUDA graph.

    python benchmarks/gpu_host_time.py [--label NAME] [--json OUT.json]

The 4-op pipeline LayerNorm -> Linear -> GELU -> Linear (64 -> 256 -> 64, 32 tokens, bf16) on the fast
path, in bf16 and under FP8 current scaling. The GPU work of one step is a few microseconds, so the
wall time of a loop with one synchronization at its end is the host's time:

* ``forward``: one fuser forward (no backward), as ``bench_fastpath.py``'s host part measures it;
* ``step eager``: forward + backward;
* ``step graphed``: the same step replayed by ``refops.make_graphed_callables`` (its guard included).

Run it twice, with ``PYTHONPATH`` pointing at two trees (``--label before`` / ``--label after``), to
compare the host cost before and after a change; a tree without ``refops.graphs`` reports no graphed
step. A host probe (two small tensors allocated and added) tells how fast this host is.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any, Callable, Optional

import torch

import refops
import refops as te
from refops.recipe import Float8CurrentScaling

CASES: list[tuple[str, Optional[type]]] = [("bf16", None), ("fp8_current_scaling", Float8CurrentScaling)]


def per_call_us(fn: Callable[[], Any], calls: int = 400, batches: int = 5) -> float:
    """Median over batches of the mean wall microseconds per call, synchronizing once per batch."""
    per_batch = calls // batches
    means = []
    for _ in range(batches):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(per_batch):
            fn()
        torch.cuda.synchronize()
        means.append(1e6 * (time.perf_counter() - start) / per_batch)
    return statistics.median(means)


def probe_us() -> float:
    def work() -> torch.Tensor:
        a = torch.empty(32, 64, dtype=torch.bfloat16, device="cuda")
        return torch.add(a, torch.empty_like(a))
    for _ in range(100):
        work()
    return per_call_us(work, calls=2000)


def build(device: torch.device) -> te.ops.Sequential:
    torch.manual_seed(0)
    return te.ops.Sequential(
        te.ops.LayerNorm(64, device=device, dtype=torch.bfloat16),
        te.ops.Linear(64, 256, device=device, dtype=torch.bfloat16),
        te.ops.GELU(),
        te.ops.Linear(256, 64, device=device, dtype=torch.bfloat16),
    )


def measure(recipe_cls: Optional[type]) -> dict[str, Any]:
    device = torch.device("cuda")
    recipe = recipe_cls() if recipe_cls is not None else None
    model = build(device)
    x = torch.randn(32, 64, device=device, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn(32, 64, device=device, dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            return model(x)

    def step() -> None:
        with te.autocast(enabled=recipe is not None, recipe=recipe):
            y = model(x)
        y.backward(dy)

    for _ in range(20):
        step()
    result: dict[str, Any] = {"forward_us": per_call_us(forward), "step_eager_us": per_call_us(step)}
    graphs = getattr(refops, "make_graphed_callables", None)
    if graphs is None:
        result["step_graphed_us"] = None
        return result
    graphed_model = build(device)
    graphed_model.load_state_dict(model.state_dict())
    graphed_model = graphs(graphed_model, (x,), enabled=recipe is not None, recipe=recipe)

    def graphed_step() -> None:
        graphed_model(x).backward(dy)

    for _ in range(5):
        graphed_step()
    # The replay computes what an eager step computes, bit for bit.
    x.grad = None
    graphed_model.zero_grad(set_to_none=True)
    y_graph = graphed_model(x)
    y_graph.backward(dy)
    dx_graph = x.grad.clone()
    x.grad = None
    model.zero_grad(set_to_none=True)
    with te.autocast(enabled=recipe is not None, recipe=recipe):
        y_eager = model(x)
    y_eager.backward(dy)
    result["graph_matches_eager"] = bool(torch.equal(y_graph, y_eager) and torch.equal(dx_graph, x.grad))
    result["step_graphed_us"] = per_call_us(graphed_step)
    return result


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="tree")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_host_time.py measures host time around CUDA work; torch reports no GPU: nothing measured")
        return 0
    refops.use_backend("fastpath")
    report: dict[str, Any] = {"label": args.label, "refops": refops.__file__, "probe_us": probe_us(), "cases": {}}
    print(f"[{args.label}] refops from {refops.__file__}; host probe {report['probe_us']:.2f} us")
    print(f"{'case':<22}{'forward us':>12}{'step eager us':>15}{'step graphed us':>17}  graph == eager")
    for name, recipe_cls in CASES:
        r = measure(recipe_cls)
        report["cases"][name] = r
        graphed = "-" if r["step_graphed_us"] is None else f"{r['step_graphed_us']:.1f}"
        print(f"{name:<22}{r['forward_us']:>12.1f}{r['step_eager_us']:>15.1f}{graphed:>17}  "
              f"{r.get('graph_matches_eager', '-')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
