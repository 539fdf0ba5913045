"""Several model instances on one Triton (one per GPU on a node): how Triton spreads requests
across instances whose ``execute`` returns at once, measured on the real server.

    python -m bench.instances [--instances 1,2,4] [--concurrency 64] [--table table:a30]

Each instance runs the project's queue and planner over the bench-only emulated engine
(bench/emulated_engine.py: a forward takes the GPU table's time and computes nothing), so N
instances stand for N GPUs without sharing this machine's two cores for forwards. perf_analyzer
drives the model at one concurrency; the per-instance metrics (the ``model_instance`` label) then say
how many rows and forwards each instance took. Triton's scheduler does not look at an instance's
kind, so KIND_CPU instances here spread requests as KIND_GPU instances do on a node.

Prints, per instance count: rows/s, p50 and p99, each instance's share of the rows, and rows per
forward (what splitting one queue into N costs the planner).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from bench.errors import reports_errors
from bench.harness import add_emulated_variant, build_repository, measure, warm_up
from bench.paths import ROOT
from python_backend.contract import INSTANCE_LABEL
from testkit.prometheus import samples_of, scrape, sum_by
from tools.triton_server import TritonServer


def by_instance(metrics_url: str, name: str, model: str) -> dict[str, float]:
    """Sum of a counter per instance label, for one model, from Prometheus text."""
    return sum_by(samples_of(scrape(metrics_url), name, model=model), INSTANCE_LABEL)


def run(instances: int, repository: Path, table: str, concurrency: int, tmp: Path, ms: int):
    model = f"emulated_x{instances}"
    add_emulated_variant(repository, "planner_dp", model, table, instances)
    server = TritonServer.loading_only(repository, (model,), tmp / f"triton-{model}.log")
    with server:
        warm_up(server, tmp, (model,), concurrency)
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        rows_before = by_instance(url, "planner_rows_total", model)
        forwards_before = by_instance(url, "planner_forwards_total", model)
        row, stable = measure(model, server.grpc_url, concurrency, tmp, ms)
        time.sleep(0.6)  # the instances publish their metrics every 0.25 s
        rows = by_instance(url, "planner_rows_total", model)
        forwards = by_instance(url, "planner_forwards_total", model)
    rows = {k: v - rows_before.get(k, 0.0) for k, v in rows.items()}
    forwards = {k: v - forwards_before.get(k, 0.0) for k, v in forwards.items()}
    return row, stable, rows, forwards


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", default="1,2,4")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--table", default="table:a30", help="the emulated forward time")
    parser.add_argument("--measurement-ms", type=int, default=8000)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    args = parser.parse_args(argv)
    repository, _ = build_repository(args.repository, rebuild=False)
    print(
        f"{'instances':>9} {'rows/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
        f"{'rows share per instance':>28} {'rows/forward':>12}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for count in (int(x) for x in args.instances.split(",")):
            row, stable, rows, forwards = run(
                count, repository, args.table, args.concurrency, Path(tmp), args.measurement_ms
            )
            total = sum(rows.values()) or 1.0
            shares = " ".join(f"{rows[k] / total:.2f}" for k in sorted(rows))
            per_forward = sum(rows.values()) / max(sum(forwards.values()), 1.0)
            print(
                f"{count:>9} {row.rows_per_s:>8.1f} {row.p50_ms:>7.1f} "
                f"{row.p99_ms:>7.1f} {shares:>28} {per_forward:>12.1f}"
                + ("" if stable else "  (unstable)"),
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
