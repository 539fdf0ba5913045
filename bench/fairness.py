"""A light client beside a heavy one: the queue shared between clients, and service classes
(the heavy client's requests in class 2).

    python -m bench.fairness [--seconds 10] [--rounds 3] [--no-write]

planner_dp over the bench-only emulated engine with this machine's own forward times (its
calibration table, ``manifest:``: the forwards sleep as long as the real ones took, so the
client and the stub have the CPU to themselves), on a Triton that forwards the client header
to the model (``tools.serve.client_forward_args``, as the launcher runs it). Over gRPC:

- the heavy client: 2 connections, each sending 2048 rows as 32 requests of 64 at once, back
  to back, as the OpenAI adapter sends a 2048-input ``/v1`` request: between them they keep the
  4096-row queue full;
- the light client: 1 closed-loop connection, one row a request.

Measured: the light client's latency alone, and the heavy client's rows/s alone; then both
together, the light client under its own client name: in the same class (the shared queue:
deficit round-robin, shares of a full queue), and with the heavy client's requests in class 2
(``priority``: service classes), alternating rounds. A refused request (503, queue full) counts apart, and is not a latency.
"""

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
from tools.serve import client_forward_args
from tools.triton_server import TritonServer, free_port

MODEL = "planner_fair"
BEGIN, END = "<!-- fairness:begin -->", "<!-- fairness:end -->"
HEAVY_CONNECTIONS, HEAVY_ROWS, CHUNK = 2, 2048, 64


@dataclass(frozen=True)
class LightPoint:
    phase: str
    latencies_ms: list[float]
    refused: int
    heavy_rows_s: float = float("nan")  # the heavy client's rows computed a second

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")


def ids_input(rows: list[np.ndarray]) -> list[grpcaio.InferInput]:
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), np.int64)
    mask = np.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
        mask[i, : len(r)] = 1
    inputs = [
        grpcaio.InferInput("INPUT_IDS", list(ids.shape), "INT64"),
        grpcaio.InferInput("ATTENTION_MASK", list(mask.shape), "INT64"),
    ]
    inputs[0].set_data_from_numpy(ids)
    inputs[1].set_data_from_numpy(mask)
    return inputs


async def heavy_connection(
    url: str, rows: list[np.ndarray], stop: asyncio.Event, priority: int
) -> None:
    """Sends its rows back to back, in class ``priority``."""
    client = grpcaio.InferenceServerClient(url)
    chunks = [ids_input(rows[a : a + CHUNK]) for a in range(0, HEAVY_ROWS, CHUNK)]
    headers = {CLIENT_PARAMETER: "heavy"}
    parameters = {CLASS_PARAMETER: priority} if priority > 1 else None
    try:
        while not stop.is_set():
            await asyncio.gather(
                *(client.infer(MODEL, c, headers=headers, parameters=parameters) for c in chunks),
                return_exceptions=True,
            )
    finally:
        await client.close()


async def light_loop(url: str, row: np.ndarray, name: str, seconds: float) -> tuple[list, int]:
    client = grpcaio.InferenceServerClient(url)
    inputs = ids_input([row])
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
    """The rows the model's forwards computed so far (its metric: counted per forward, so it
    grows smoothly, where answers come a whole request at a time)."""
    return sum(s.value for s in samples_of(scrape(metrics_url), "planner_rows_total", model=MODEL))


async def phase(
    metrics_url: str,
    url: str,
    rows: list[np.ndarray],
    light_name: str | None,
    seconds: float,
    heavy_priority: int | None = 1,
) -> tuple[list[float], int, float]:
    """The light client for ``seconds`` (none if ``light_name`` is None), beside the heavy one
    in class ``heavy_priority`` (none if None): the light latencies, refusals, heavy rows/s."""
    stop = asyncio.Event()
    heavy = []
    if heavy_priority is not None:
        heavy_rows = [rows[i % len(rows)] for i in range(HEAVY_ROWS)]
        heavy = [
            asyncio.ensure_future(heavy_connection(url, heavy_rows, stop, heavy_priority))
            for _ in range(HEAVY_CONNECTIONS)
        ]
        await asyncio.sleep(2.0)  # the queue fills first
    computed, started = rows_computed(metrics_url), time.monotonic()
    if light_name is None:
        await asyncio.sleep(seconds)
        latencies: list[float] = []
        refused = 0
    else:
        latencies, refused = await light_loop(url, rows[0], light_name, seconds)
    # the light client's rows are one a request
    rows_s = (rows_computed(metrics_url) - computed - len(latencies)) / (time.monotonic() - started)
    stop.set()
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
    parser.add_argument(
        "--class-wait-ms", default=CONFIG_DEFAULTS["class_wait_ms"], help="the model's setting"
    )
    args = parser.parse_args()
    repository, _ = build_repository(args.repository, rebuild=False)
    source = repository / "planner_dp"
    table = f"manifest:{source}"
    add_variant(
        repository, "planner_dp", MODEL, table, parameters={"class_wait_ms": args.class_wait_ms}
    )
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
            asyncio.run(phase(metrics, url, rows, "light", 2.0, None))  # warm
            points.append(
                LightPoint("alone", *asyncio.run(phase(metrics, url, rows, "light", s, None)))
            )
            phases = [
                ("heavy alone", None, 1),
                ("shared queue", "light", 1),
                ("classes", "light", 2),
            ]
            for r, (name, light, priority) in alternating(phases, args.rounds):
                got = asyncio.run(phase(metrics, url, rows, light, s, priority))
                points.append(LightPoint(name, *got))
                p = points[-1]
                print(
                    f"round {r + 1} {name:<13} p50 {p.percentile(50):8.1f} ms  p99 "
                    f"{p.percentile(99):8.1f} ms  answered {len(p.latencies_ms)}  refused "
                    f"{p.refused}  heavy {p.heavy_rows_s:7.1f} rows/s",
                    flush=True,
                )
    table_lines = [
        "| phase | answered | refused (503) | p50 ms | p99 ms | heavy rows/s |",
        "|---|---|---|---|---|---|",
    ]
    for p in points:
        table_lines.append(
            f"| {p.phase} | {len(p.latencies_ms)} | {p.refused} | {p.percentile(50):.1f} | "
            f"{p.percentile(99):.1f} | {p.heavy_rows_s:.1f} |"
        )

    def pooled(name: str) -> LightPoint:
        chosen = [p for p in points if p.phase == name]
        return LightPoint(
            name,
            [x for p in chosen for x in p.latencies_ms],
            sum(p.refused for p in chosen),
            float(np.mean([p.heavy_rows_s for p in chosen])),
        )

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
