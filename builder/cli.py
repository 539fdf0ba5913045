"""`python -m builder build`: the command line over ``builder.build.build``.

Every option is a field of ``builder.spec.BuildSpec``, with the field's default and help: code
and tests construct the spec directly and never build an argv list.
"""

from __future__ import annotations

import argparse
import sys

from builder.build import build
from builder.spec import BuildError, add_cli_args, from_cli_args


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m builder", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    build_parser = sub.add_parser(
        "build",
        help="build engines and a Triton model-repository entry",
        description="Export a Hugging Face model, choose length buckets, build the engine, "
        "calibrate the planner's cost model, and write model_repository/<name>/.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_cli_args(build_parser)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        build(from_cli_args(args))
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
