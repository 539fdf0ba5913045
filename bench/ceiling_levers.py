"""A lever on one instance's own ceiling, side by side with the unchanged model.

    python -m bench.ceiling_levers --lever instances:2 [--rounds 3] [--seconds 4]

planner_dp over the bench-only emulated engine with a zero table (forwards take no time), twice
in one Triton: as it is, and with one lever pulled; perf_analyzer at 64 rows in flight measures
each in turn, the order flipping every round, so the shared machine's drift falls on both.
Levers (each bench-only, set by the variant's own model.py or config, never by the project):
- ``instances:N``: N model instances (stub processes, queues) instead of one;
- ``switch-interval:MS``: the stub's ``sys.setswitchinterval`` (the GIL hand-over);
- ``no-cancel-check-at-admit``: ``is_cancelled`` asked only before a forward, not at admission;
- ``no-cancel-check``: ``is_cancelled`` never asked.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

from bench.emulated_engine import EMULATED_MODEL_PY
from bench.errors import BenchError, reports_errors
from bench.harness import add_emulated_variant, build_repository, measure, warm_up
from bench.levers import PATCHES
from bench.paths import ROOT
from tools.triton_server import TritonServer

AS_IS, PULLED = "lever_as_is", "lever_pulled"
EMULATED_IMPORT = "from bench.emulated_model import EmulatedEngineModel as TritonPythonModel"


def lever_model(lever: str) -> tuple[str, int]:
    """(the variant's model.py, its instance count) for ``lever``."""
    kind, _, value = lever.partition(":")
    if kind == "instances" and value.isdigit() and int(value) >= 1:
        return EMULATED_MODEL_PY, int(value)
    if kind == "switch-interval" and value:
        prelude = f"import sys\nsys.setswitchinterval({float(value) / 1e3!r})\n"
    elif lever in PATCHES:
        prelude = f"from bench.levers import pull\npull({lever!r})\n"
    else:
        raise BenchError(
            f"no lever {lever!r}; known: instances:N, switch-interval:MS, {', '.join(PATCHES)}"
        )
    body = f'"""Bench only: the emulated model with {lever}."""\n{prelude}{EMULATED_IMPORT}\n'
    return body + '\n__all__ = ["TritonPythonModel"]\n', 1


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lever", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args(argv)
    pulled_py, count = lever_model(args.lever)
    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    for name, model_py, instances in ((AS_IS, EMULATED_MODEL_PY, 1), (PULLED, pulled_py, count)):
        add_emulated_variant(repository, "planner_dp", name, "zero", instances, model_py)
    rates: dict[str, list[float]] = {AS_IS: [], PULLED: []}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        with TritonServer.loading_only(repository, (AS_IS, PULLED), tmp / "t.log") as server:
            warm_up(server, tmp, (AS_IS, PULLED), args.concurrency)
            for r in range(args.rounds):
                for model in (AS_IS, PULLED) if r % 2 == 0 else (PULLED, AS_IS):
                    row, _ = measure(
                        model, server.grpc_url, args.concurrency, tmp, args.seconds * 1000
                    )
                    rates[model].append(row.rows_per_s)
    print(f"as it is: {', '.join(f'{x:.0f}' for x in rates[AS_IS])} rows/s")
    print(f"{args.lever}: {', '.join(f'{x:.0f}' for x in rates[PULLED])} rows/s")
    ratio = float(np.mean(rates[PULLED]) / np.mean(rates[AS_IS]))
    print(f"{args.lever} over as it is (means of {args.rounds} rounds): {ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
