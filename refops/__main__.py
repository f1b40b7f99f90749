"""Command line: ``python -m refops {trace,check,bench,conformance}``."""

from __future__ import annotations

import sys
from typing import Sequence

from .cli import bench_cmd, check_cmd, conformance_cmd, trace_cmd
from .cli.arguments import Parser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = Parser(
        prog="refops",
        description="refops: the parameter lifecycle and low-precision recipes, step by step.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    trace_cmd.add_parser(sub)
    check_cmd.add_parser(sub)
    bench_cmd.add_parser(sub)
    conformance_cmd.add_parser(sub)
    args, extra = parser.parse_known_args(argv)
    if extra:
        if args.command != "bench":
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.script_args = [*args.script_args, *extra]
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
