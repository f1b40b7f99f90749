"""Command line: ``python -m refops trace`` (the lifecycle of a demo pipeline, step by step)."""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

__all__ = ["main"]


def _trace(args: argparse.Namespace) -> int:
    from .demo import run_demo

    result = run_demo(steps=args.steps, meta=not args.eager)
    titles = ["construction"] + [f"training step {i}" for i in range(1, args.steps + 1)]
    for title, t in zip(titles, result.step_traces):
        print(f"== {title} ({len(t.events)} events)")
        print(t.render_text() or "   (no lifecycle events)")
    print("== summary")
    print(f"losses: {', '.join(f'{loss:.5f}' for loss in result.losses)}")
    print(f"parameters on: {', '.join(sorted(result.devices))}")
    print(f"every parameter kept its identity through materialization: {result.parameters_kept_identity}")
    print(f"the optimizer built before the first forward holds the live parameters: "
          f"{result.optimizer_holds_live_parameters}")
    ok = result.parameters_kept_identity and result.optimizer_holds_live_parameters
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="refops", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    trace = sub.add_parser("trace", help="build a demo MLP on meta, train it, print every lifecycle event")
    trace.add_argument("--steps", type=int, default=3, help="training steps (default 3)")
    trace.add_argument("--eager", action="store_true", help="build on the default device instead of meta")
    trace.set_defaults(func=_trace)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
