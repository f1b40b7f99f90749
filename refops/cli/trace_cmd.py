"""``refops trace``: the lifecycle of a demo pipeline, step by step, as text or a Mermaid diagram."""

from __future__ import annotations

import argparse
import pathlib
import shlex
import sys

from ..demo import run_demo
from ..testing.recipes import RECIPE_NAMES, TEST_RECIPES_NOTE, make_recipe, recipe_settings
from .arguments import at_least, output_file, refuse

__all__ = ["add_parser", "mermaid_view_command"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("trace", help="build a demo MLP (on meta), train it, print every lifecycle event")
    p.add_argument("--steps", type=at_least(1, "the trace and its checks are about training steps"), default=3,
                   help="training steps, at least 1 (default 3)")
    p.add_argument("--eager", action="store_true", help="build on the default device instead of meta")
    p.add_argument("--recipe", choices=RECIPE_NAMES, help="train under refops.autocast with this recipe")
    p.add_argument("--quantized-weights", action="store_true", help="build inside quantized_model_init")
    p.add_argument("--mermaid", metavar="FILE", type=output_file,
                   help="also write the first training step as a Mermaid sequence diagram to FILE (no file without it)")
    p.add_argument("--distributed", type=at_least(1), metavar="N",
                   help="run the FSDP2 demo on N CPU ranks (gloo): meta build, fully_shard, to_empty + "
                        "reset_parameters, training; print each rank's lifecycle events")
    p.set_defaults(func=run)


def mermaid_view_command(diagram: pathlib.Path) -> str:
    """The command that renders ``diagram`` to an SVG beside it without network: mermaidx, the pinned Mermaid
    renderer the docs extra installs (``docs/getting-started.md#reading-python--m-refops-trace``)."""
    svg = diagram.with_suffix(".svg")
    return f"python3 -m mermaidx -i {shlex.quote(str(diagram))} -o {shlex.quote(str(svg))}"


def run(args: argparse.Namespace) -> int:
    if args.distributed is not None:
        return run_distributed(args)
    if args.quantized_weights and args.recipe is None:
        refuse("trace", "--quantized-weights needs --recipe")
    recipe = make_recipe(args.recipe) if args.recipe else None
    if args.recipe:
        settings = recipe_settings(args.recipe)
        note = "" if settings.endswith("(the defaults)") else f": {TEST_RECIPES_NOTE}"
        print(f"recipe: {args.recipe} = {settings}{note}")
    result = run_demo(steps=args.steps, meta=not args.eager, recipe=recipe, quantized_weights=args.quantized_weights)
    titles = ["construction"] + [f"training step {i}" for i in range(1, args.steps + 1)]
    for title, t in zip(titles, result.step_traces):
        print(f"== {title} ({len(t.events)} events)")
        print(t.render_text(result.op_names) or "   (no lifecycle events)")
    print("== summary")
    print(f"recipe: {args.recipe or 'none (high precision)'}; weights: {result.weight_type}")
    print(f"losses: {', '.join(f'{loss:.5f}' for loss in result.losses)}")
    print(f"parameters on: {', '.join(sorted(result.devices))}")
    print(f"every parameter kept its identity through materialization: {result.parameters_kept_identity}")
    print(f"the optimizer built before the first forward holds the live parameters: "
          f"{result.optimizer_holds_live_parameters}")
    if args.mermaid is not None:  # --steps >= 1: the first training step is there
        try:  # the path was probed before the demo; this catches what changed since (a full disk)
            args.mermaid.write_text(result.step_traces[1].render_mermaid() + "\n")
        except OSError as error:
            print(f"refops trace: error: could not write {args.mermaid}: {error.strerror or error}", file=sys.stderr)
            return 2
        print(f"wrote the first training step as a Mermaid diagram to {args.mermaid}")
        print(f"view it offline: {mermaid_view_command(args.mermaid)}, then open the SVG in a browser "
              "(mermaidx comes with the docs and test extras)")
    return 0 if result.parameters_kept_identity and result.optimizer_holds_live_parameters else 1


def run_distributed(args: argparse.Namespace) -> int:
    """``--distributed N``: the FSDP2 demo (:mod:`refops.distributed.demo`), one section per rank and phase."""
    if args.recipe or args.quantized_weights or args.eager or args.mermaid:
        refuse("trace", "--distributed runs its own high-precision meta-built demo; "
                        "drop --recipe, --quantized-weights, --eager and --mermaid")
    from ..distributed.demo import run_distributed_demo

    reports = run_distributed_demo(args.distributed, args.steps)
    for report in reports:
        for title, events in report.phases:
            print(f"== rank {report.rank}: {title} ({len(events)} events)")
            print("\n".join(f"{i:3d}. {e}" for i, e in enumerate(events, 1)) or "   (no lifecycle events)")
    print("== summary")
    first = reports[0]
    print(f"ranks: {len(reports)} (gloo on the CPU); local shards on rank 0: "
          + ", ".join(f"{n} {list(s)}" for n, s in first.local_shapes.items()))
    print(f"losses (mean over ranks): {', '.join(f'{loss:.5f}' for loss in first.losses)}")
    ok = {
        "every parameter is still the same DTensor object": all(r.kept_identity and r.all_dtensors for r in reports),
        "full_tensor() equals a single-process eager build (bit for bit)": all(
            r.init_equals_single_process for r in reports),
    }
    for claim, holds in ok.items():
        print(f"{claim}: {holds}")
    return 0 if all(ok.values()) else 1
