"""The simulator against the real server: the server's own time per row, measured over the
emulated engine, and rounds of simulated beside served throughput on the same model."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bench.cost_tables import (
    CostTable,
    manifest_table,
    scaled_table,
)
from bench.paths import ROOT
from bench.sim.run import Result, simulate

# -- the report (make simulate) -----------------------------------------------------------------


def forward_stats(metrics_url: str, model: str) -> dict[int, dict[str, float]]:
    """Per bucket, from the model's own metrics: forwards, rows and seconds spent in forwards."""
    from testkit.prometheus import samples_of, scrape, sum_by

    samples = scrape(metrics_url)
    out: dict[int, dict[str, float]] = {}
    names = {
        "planner_forwards_total": "forwards",
        "planner_rows_total": "rows",
        "planner_forward_seconds_sum": "seconds",
    }
    for metric, key in names.items():
        for bucket, value in sum_by(samples_of(samples, metric, model=model), "bucket").items():
            if bucket.isdigit():
                out.setdefault(int(bucket), {})[key] = value
    return out


def forwards_between(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]]
) -> dict[int, dict[str, float]]:
    """Per bucket, the forwards, rows and forward seconds between two ``forward_stats``."""
    keys = ("forwards", "rows", "seconds")
    return {
        bucket: {k: now.get(k, 0.0) - before.get(bucket, {}).get(k, 0.0) for k in keys}
        for bucket, now in after.items()
    }


def served_over_calibrated(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]], table: CostTable
) -> float:
    """Time the served forwards took over what the calibrated table gives for the same forwards
    (each bucket's forwards at its mean rows per forward)."""
    served = predicted = 0.0
    for bucket, done in forwards_between(before, after).items():
        if done["forwards"] <= 0:
            continue
        rows = done["rows"] / done["forwards"]
        served += done["seconds"]
        predicted += done["forwards"] * table.seconds(max(1, round(rows)), bucket)
    return served / predicted if predicted else float("nan")


EMULATED = "server_time"  # the emulated variant of a model, in a scratch repository


def server_time_per_row(
    version_dir: Path, tmp: Path, ms: int, concurrency: int = 64, rows_per_request: int = 1
) -> float:
    """The server's own time per row for the model at ``version_dir``, measured now: the model's
    config, queue and planner over the bench-only emulated engine with a zero table (forwards
    take no time), in a scratch repository (the model's own repository is never written), served
    by the real Triton under perf_analyzer with ``concurrency`` rows in flight, in requests of
    ``rows_per_request`` rows. Microseconds per row."""
    from bench.harness import add_variant, measure, warm_up
    from tools.triton_server import TritonServer

    model_dir = Path(version_dir).resolve().parent
    repository = tmp / "server-time-repository"
    repository.mkdir(parents=True, exist_ok=True)
    source = repository / model_dir.name
    if not source.exists():
        source.symlink_to(model_dir)
    add_variant(repository, model_dir.name, EMULATED, "zero")
    server = TritonServer.loading_only(repository, (EMULATED,), tmp / "server-time.log")
    with server:
        warm_up(server, tmp, (EMULATED,), concurrency)
        clients = max(1, concurrency // rows_per_request)
        row, _ = measure(
            EMULATED, server.grpc_url, clients, tmp, ms, rows_per_request=rows_per_request
        )
    return 1e6 / row.rows_per_s


@dataclass
class ServedPoint:
    """One served measurement and what the simulator makes of it."""

    rows_per_s: float
    p50_ms: float
    server_us: float  # the server's own time per row, measured in the same round
    forwards_slowdown: float  # the served forwards' own time, over the calibrated table


def validate(lengths: Sequence[int], ms: int, rounds: int = 2) -> tuple[str, float]:
    """The real server beside the simulator, in one run, on the bench repository. Each of
    ``rounds`` rounds measures the server's own time per row (``server_time_per_row``), then
    serves planner_dp at 8, 32 and 64 clients; the simulator predicts each point from the
    calibrated CPU table and that round's time per row. Returns (table, the median time per
    row)."""
    import tempfile

    from bench.harness import build_repository, measure, warm_up
    from tools.triton_server import TritonServer

    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    version_dir = repository / "planner_dp" / "1"
    table = manifest_table(version_dir)
    levels = [8, 32, 64]
    points: dict[int, list[ServedPoint]] = {c: [] for c in levels}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        server = TritonServer.loading_only(repository, ("planner_dp",), tmp / "t.log")
        with server:
            warm_up(server, tmp, ("planner_dp",), 64)
            metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            for _ in range(rounds):
                server_us = server_time_per_row(version_dir, tmp, ms)
                print(f"server's own time: {server_us:.0f} us per row", flush=True)
                for c in levels:
                    before = forward_stats(metrics_url, "planner_dp")
                    row, _ = measure("planner_dp", server.grpc_url, c, tmp, ms)
                    time.sleep(0.6)  # the model publishes its metrics every 0.25 s
                    slowdown = served_over_calibrated(
                        before, forward_stats(metrics_url, "planner_dp"), table
                    )
                    point = ServedPoint(
                        row.rows_per_s,
                        row.p50_ms,
                        server_us,
                        slowdown,
                    )
                    points[c].append(point)
                    print(f"c={c}: {point}", flush=True)

    def each(values: Sequence[float], fmt: str = ".2f") -> str:
        return ", ".join(f"{v:{fmt}}" for v in values)

    def simulated(point: ServedPoint, c: int, factor: float = 1.0) -> Result:
        return simulate(
            lengths,
            scaled_table(table, factor) if factor != 1.0 else table,
            "dp",
            concurrency=c,
            seconds=60,
            server_us_per_row=point.server_us,
        )

    per_round_us = [p.server_us for p in points[levels[0]]]
    lines = [
        f"{rounds} rounds, in one run; each column lists the rounds in order. The server's own "
        f"time per row, measured at the start of each round: {each(per_round_us, '.0f')} us.",
        "",
        "| concurrency | served rows/s | simulated rows/s | simulated / served | served p50 ms | simulated p50 ms | served forwards / calibrated | simulated with served forward times / served |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in levels:
        mine = points[c]
        plain = [simulated(p, c) for p in mine]
        in_place = [simulated(p, c, p.forwards_slowdown).rows_per_s / p.rows_per_s for p in mine]
        lines.append(
            f"| {c} | {each([p.rows_per_s for p in mine], '.1f')} | "
            f"{each([r.rows_per_s for r in plain], '.1f')} | "
            f"{each([r.rows_per_s / p.rows_per_s for r, p in zip(plain, mine, strict=True)])} | "
            f"{each([p.p50_ms for p in mine], '.0f')} | "
            f"{each([r.percentile_ms(50) for r in plain], '.0f')} | "
            f"{each([p.forwards_slowdown for p in mine])} | {each(in_place)} |"
        )
    return "\n".join(lines), float(np.median(per_round_us))
