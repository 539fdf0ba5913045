"""A light client beside a heavy one: the queue shared between clients, against one queue.

    python -m bench.fairness [--seconds 10] [--rounds 3] [--no-write]

planner_dp over the bench-only emulated engine with this machine's own forward times (its
calibration table, ``manifest:``: the forwards sleep as long as the real ones took, so the
client and the stub have the CPU to themselves), on a Triton that forwards the client header
to the model (``tools.serve.client_forward_args``, as the launcher runs it). Over gRPC:

- the heavy client: 2 connections, each sending 2048 rows as 32 requests of 64 at once, back
  to back, as the OpenAI adapter sends a 2048-input ``/v1`` request: between them they keep the
  4096-row queue full;
- the light client: 1 closed-loop connection, one row a request.

Measured: the light client's latency alone; then beside the heavy client, with its own client
name (the shared queue: deficit round-robin, shares of a full queue) and with the heavy
client's name (what one queue for everyone did before), alternating rounds. A refused request
(503, queue full) counts apart, and is not a latency.
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
from python_backend.common.contract import CLIENT_PARAMETER
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


async def heavy_connection(url: str, rows: list[np.ndarray], stop: asyncio.Event) -> None:
    client = grpcaio.InferenceServerClient(url)
    chunks = [ids_input(rows[a : a + CHUNK]) for a in range(0, HEAVY_ROWS, CHUNK)]
    headers = {CLIENT_PARAMETER: "heavy"}
    try:
        while not stop.is_set():
            await asyncio.gather(
                *(client.infer(MODEL, c, headers=headers) for c in chunks), return_exceptions=True
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


async def phase(url: str, rows: list[np.ndarray], light_name: str | None, seconds: float):
    """The light client for ``seconds``; beside the heavy one unless ``light_name`` is None."""
    stop = asyncio.Event()
    heavy = []
    if light_name is not None:
        heavy_rows = [rows[i % len(rows)] for i in range(HEAVY_ROWS)]
        heavy = [
            asyncio.ensure_future(heavy_connection(url, heavy_rows, stop))
            for _ in range(HEAVY_CONNECTIONS)
        ]
        await asyncio.sleep(2.0)  # the queue fills first
    latencies, refused = await light_loop(url, rows[0], light_name or "light", seconds)
    stop.set()
    for task in heavy:  # cancelled calls reach the model, which drops their rows unrun
        task.cancel()
    await asyncio.gather(*heavy, return_exceptions=True)
    if heavy:
        await asyncio.sleep(3.0)  # the forward running when they were cancelled ends
    return latencies, refused


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repo")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/")
    args = parser.parse_args()
    repository, _ = build_repository(args.repository, rebuild=False)
    source = repository / "planner_dp"
    table = f"manifest:{source}"
    add_variant(repository, "planner_dp", MODEL, table)
    forward_s = cost_table(table)
    layout = forward_s.layout
    longest_ms = 1e3 * max(
        forward_s.seconds(layout.max_rows(length), length) for length in layout.lengths
    )
    rows = request_rows(source / "1")
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
            asyncio.run(phase(url, rows, None, 2.0))  # warm
            alone = asyncio.run(phase(url, rows, None, args.seconds))
            points.append(LightPoint("alone", *alone))
            phases = [("shared queue", "light"), ("one queue", "heavy")]
            for r, (name, light_name) in alternating(phases, args.rounds):
                got = asyncio.run(phase(url, rows, light_name, args.seconds))
                points.append(LightPoint(name, *got))
                p = points[-1]
                print(
                    f"round {r + 1} {name:<13} p50 {p.percentile(50):8.1f} ms  p99 "
                    f"{p.percentile(99):8.1f} ms  answered {len(p.latencies_ms)}  refused "
                    f"{p.refused}",
                    flush=True,
                )
    table_lines = [
        "| phase | answered | refused (503) | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for p in points:
        table_lines.append(
            f"| {p.phase} | {len(p.latencies_ms)} | {p.refused} | {p.percentile(50):.1f} | "
            f"{p.percentile(99):.1f} |"
        )

    def pooled(name: str) -> LightPoint:
        chosen = [p for p in points if p.phase == name]
        return LightPoint(
            name, [x for p in chosen for x in p.latencies_ms], sum(p.refused for p in chosen)
        )

    alone_p99 = points[0].percentile(99)
    shared, one = pooled("shared queue"), pooled("one queue")
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
        one=f"{one.percentile(99):.1f}",
        one_refused=one.refused,
        verdict="within" if shared.percentile(99) <= bound else "over",
    )
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
