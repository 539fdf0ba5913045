"""A light client beside a heavy one: the queue shared between clients, and service classes.

    python -m bench.fairness [--seconds 10] [--rounds 3] [--class-wait-ms 50] [--no-write]

planner_dp on the bench-only emulated engine with this machine's own forward times (they sleep as
long as the real ones took), on a Triton forwarding the client header, over gRPC. The heavy client:
2 connections, each 2048 rows as 32 requests of 64 at once, back to back (the 4096-row queue full);
the light client: one closed-loop connection, one row a request. Measured: the light client alone;
the heavy one alone, beside the light one in its class (the shared queue), and in class 2
(``priority``), alternating rounds. A refusal (503) counts apart."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bench.cost_tables import cost_table
from bench.docs import publish, render
from bench.errors import reports_errors
from bench.harness import add_variant, alternating, build_repository, request_rows
from bench.paths import ROOT
from python_backend.common.contract import CLASS_PARAMETER, CLIENT_PARAMETER
from python_backend.settings import CONFIG_DEFAULTS
from testkit.prometheus import samples_of, scrape
from testkit.triton_clients import id_inputs
from tools.serve import client_forward_args
from tools.triton_server import TritonServer, free_port

MODEL = "planner_fair"
BEGIN, END = "<!-- fairness:begin -->", "<!-- fairness:end -->"
HEAVY_CONNECTIONS, HEAVY_ROWS, CHUNK = 2, 2048, 64
# (phase, the light client's name or none, the heavy client's class): alternated each round
PHASES = [("heavy alone", None, 1), ("shared queue", "light", 1), ("classes", "light", 2)]


@dataclass(frozen=True)
class LightPoint:
    phase: str
    latencies_ms: list[float]
    refused: int
    heavy_rows_s: float = float("nan")  # the heavy client's rows computed a second

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def row(self) -> str:
        return (
            f"| {self.phase} | {len(self.latencies_ms)} | {self.refused} | "
            f"{self.percentile(50):.1f} | {self.percentile(99):.1f} | {self.heavy_rows_s:.1f} |"
        )


async def heavy_connection(url: str, rows: list[np.ndarray], priority: int) -> None:
    """Sends its rows back to back, in class ``priority``, until cancelled."""
    client = grpcaio.InferenceServerClient(url)
    chunks = [id_inputs("grpc", rows[a : a + CHUNK]) for a in range(0, HEAVY_ROWS, CHUNK)]
    headers = {CLIENT_PARAMETER: "heavy"}
    parameters = {CLASS_PARAMETER: priority} if priority > 1 else None
    try:
        while True:
            await asyncio.gather(
                *(client.infer(MODEL, c, headers=headers, parameters=parameters) for c in chunks),
                return_exceptions=True,
            )
    finally:
        await client.close()


async def light_loop(
    url: str, row: np.ndarray, name: str | None, seconds: float
) -> tuple[list[float], int]:
    """Latencies (ms) and refusals of ``name``'s closed loop; none (a wait) for None."""
    if name is None:
        await asyncio.sleep(seconds)
        return [], 0
    client = grpcaio.InferenceServerClient(url)
    inputs = id_inputs("grpc", [row])
    latencies, refused = [], 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                await client.infer(MODEL, inputs, headers={CLIENT_PARAMETER: name})
                latencies.append((time.perf_counter() - started) * 1e3)
            except InferenceServerException:
                refused += 1
                await asyncio.sleep(0.01)
    finally:
        await client.close()
    return latencies, refused


def rows_computed(metrics_url: str) -> float:
    """Rows the model's forwards computed (smooth, where answers come a request at a time)."""
    return sum(s.value for s in samples_of(scrape(metrics_url), "planner_rows_total", model=MODEL))


async def phase(
    metrics_url: str,
    url: str,
    rows: list[np.ndarray],
    light_name: str | None,
    seconds: float,
    heavy_priority: int = 1,
) -> tuple[list[float], int, float]:
    """The light client for ``seconds`` (none if ``light_name`` is None), beside the heavy one
    in class ``heavy_priority`` (none if 0): the light latencies, refusals, and the heavy rows
    computed a second (the light client's are one a request)."""
    heavy_rows = [rows[i % len(rows)] for i in range(HEAVY_ROWS)]
    heavy = [
        asyncio.ensure_future(heavy_connection(url, heavy_rows, heavy_priority))
        for _ in range(HEAVY_CONNECTIONS if heavy_priority else 0)
    ]
    await asyncio.sleep(2.0 if heavy else 0.0)  # the queue fills first
    computed, started = rows_computed(metrics_url), time.monotonic()
    latencies, refused = await light_loop(url, rows[0], light_name, seconds)
    rows_s = (rows_computed(metrics_url) - computed - len(latencies)) / (time.monotonic() - started)
    for task in heavy:  # cancelled calls reach the model, which drops their rows unrun
        task.cancel()
    await asyncio.gather(*heavy, return_exceptions=True)
    if heavy:
        await asyncio.sleep(3.0)  # the forward running when they were cancelled ends
    return latencies, refused, rows_s if heavy else float("nan")


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repo")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/")
    parser.add_argument("--class-wait-ms", default=CONFIG_DEFAULTS["class_wait_ms"])
    args = parser.parse_args()
    repository, _ = build_repository(args.repository, rebuild=False)
    source = repository / "planner_dp"
    table = f"manifest:{source}"
    wait = {"class_wait_ms": args.class_wait_ms}
    add_variant(repository, "planner_dp", MODEL, table, parameters=wait)
    forward_s = cost_table(table)
    layout = forward_s.layout
    longest_ms = 1e3 * max(
        forward_s.seconds(layout.max_rows(length), length) for length in layout.lengths
    )
    rows = request_rows(source / "1")
    s = args.seconds
    points: list[LightPoint] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(
            repository,
            free_port(),
            free_port(),
            free_port(),
            log_path=Path(tmp) / "triton.log",
            extra_args=client_forward_args(),
        )
        with server:
            url = server.grpc_url
            metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
            asyncio.run(phase(metrics, url, rows, "light", 2.0, 0))  # warm
            rounds = [(0, ("alone", "light", 0)), *alternating(PHASES, args.rounds)]
            for r, (name, light, priority) in rounds:
                got = asyncio.run(phase(metrics, url, rows, light, s, priority))
                points.append(LightPoint(name, *got))
                print(f"round {r + 1}: {points[-1].row()}", flush=True)
    table_lines = [
        "| phase | answered | refused (503) | p50 ms | p99 ms | heavy rows/s |",
        "|---|---|---|---|---|---|",
        *(p.row() for p in points),
    ]

    def pooled(name: str) -> LightPoint:
        chosen = [p for p in points if p.phase == name]
        rows_s = float(np.mean([p.heavy_rows_s for p in chosen]))
        latencies = [x for p in chosen for x in p.latencies_ms]
        return LightPoint(name, latencies, sum(p.refused for p in chosen), rows_s)

    alone_p99 = points[0].percentile(99)
    heavy_alone = pooled("heavy alone").heavy_rows_s
    shared, classes = pooled("shared queue"), pooled("classes")
    bound = 2 * alone_p99 + longest_ms
    text = render(
        "fairness",
        seconds=f"{args.seconds:g}",
        rounds=args.rounds,
        table="\n".join(table_lines),
        alone=f"{alone_p99:.1f}",
        longest=f"{longest_ms:.1f}",
        bound=f"{bound:.1f}",
        shared=f"{shared.percentile(99):.1f}",
        shared_refused=shared.refused,
        verdict="within" if shared.percentile(99) <= bound else "over",
        wait=args.class_wait_ms,
        classes=f"{classes.percentile(99):.1f}",
        classes_p50=f"{classes.percentile(50):.1f}",
        heavy_alone=f"{heavy_alone:.1f}",
        heavy_classes=f"{classes.heavy_rows_s / heavy_alone:.2f}",
        heavy_shared=f"{shared.heavy_rows_s / heavy_alone:.2f}",
    )
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
