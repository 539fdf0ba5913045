"""A bulk flood beside interactive clients: the queue shared between clients, service classes,
and the peers' batchers at the same loads.

    python -m bench.fairness [--costs table:a30*20,real] [--seconds 8] [--rounds 3]
        [--class-wait-ms 50] [--class-rider-factor 2] [--no-write]

Served: planner_dp on the real Triton forwarding the client header, over gRPC, on each engine of
``--costs``: ``manifest``, the bench-only emulated engine with this machine's calibrated forward
times (they sleep as long as the real ones took); a cost table (``table:a30*20``: the derived
A30 times, 20 times as long, so that the engine and not this machine's CPU saturates); ``real``,
ONNX Runtime, make serve's engine. The bulk client: 2 connections, each keeping 2048 rows in
flight as 32 requests of 64, each sent again once answered (the 4096-row queue full); the interactive clients: closed loops,
one row a request; the bulk client runs in a process of its own (in theirs, its bursts of
answers would hold their answers back). Phases, alternating rounds: the interactive clients
alone, the bulk alone, both in one class (round-robin between clients: today without classes),
and the bulk in class 2 (``priority``), on the model and on a variant with interactive forwards
taking more riders (``class_rider_factor`` MORE_RIDERS). A refusal (503) counts apart; the
CPU's busy share is measured per phase.

Simulated (``bench.sim``, virtual time, no server): the same kind of loads on the A100 and A30
tables for the project's planner with and without classes, Triton's dynamic batcher with
priority levels, and a FIFO token-budget batcher (text-embeddings-inference's); each step
planned while the forward before it runs, as served on a GPU (``overlap``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import multiprocessing
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import numpy as np
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from bench.cost_tables import cost_table, gpu_table, read_lengths
from bench.docs import publish, render
from bench.emulated_engine import TABLE_FILE
from bench.errors import BenchError, reports_errors
from bench.harness import (
    PEER_MODEL_PY,
    PEER_QUEUE_DELAY_US,
    add_variant,
    alternating,
    build_repository,
    cpu_times,
    request_rows,
)
from bench.paths import LENGTHS, ROOT
from bench.sim.run import Load, simulate
from builder.triton_config import add_model_variant, write_config
from python_backend.common.contract import CLASS_PARAMETER, CLIENT_PARAMETER
from python_backend.scheduling.policy import ServiceClasses
from python_backend.settings import CONFIG_DEFAULTS
from testkit.prometheus import samples_of, scrape
from testkit.triton_clients import id_inputs
from tools.serve import client_forward_args
from tools.triton_server import TritonServer, free_port

BEGIN, END = "<!-- fairness:begin -->", "<!-- fairness:end -->"
HEAVY_CONNECTIONS, HEAVY_ROWS, CHUNK = 2, 2048, 64
LIGHT_CLIENTS = 2
# riders the "more riders" phase lets an interactive forward take (``class_rider_factor``): what
# an engine whose forwards cost much fixed time may set
MORE_RIDERS = 3
MORE = f"classes (class_rider_factor {MORE_RIDERS})"
# (phase, the light clients run, the heavy client's class or 0 for none, the model: the
# project's, "riders" its variant with MORE_RIDERS, or "peer"): alternated each round
PHASES = [
    ("interactive alone", True, 0, ""),
    ("bulk alone", False, 1, ""),
    ("one class", True, 1, ""),
    ("classes", True, 2, ""),
    (MORE, True, 2, "riders"),
    ("peer: interactive alone", True, 0, "peer"),
    ("peer: bulk alone", False, 1, "peer"),
    ("peer: priority levels", True, 2, "peer"),
]
# the simulated loads: interactive clients beside bulk connections of 64-row requests
SIM_BULK = Load(clients=16, rows=64, client="bulk")
SIM_ROUND_TRIP_US = 1000.0
SIM_SEEDS = (0, 1, 2)
# (label, simulator policy, the bulk's class, class_wait_ms or None for --class-wait-ms): in
# class 2, the project's classes for the planner (and with the wait a GPU deployment might set:
# 0.4-0.45 of the longest forward, GPU_WAIT_MS); for Triton's priority levels, strict priority
# (no cap, no share). Every policy runs overlapped, as on a GPU: a step planned while the
# forward before it runs
STRICT = ServiceClasses(wait_s=1e9, min_share=0.0)
GPU_WAIT_MS = {"a100": 1.2, "a30": 2.0}
SIM_POLICIES: list[tuple[str, str, int, dict[str, float] | None]] = [
    ("planner, classes", "dp", 2, None),
    ("planner, classes, GPU wait", "dp", 2, GPU_WAIT_MS),
    ("planner, one class", "dp", 1, None),
    ("Triton priority levels", "dynamic_batcher", 2, None),
    ("FIFO token budget (TEI)", "token_budget", 1, None),
]


@dataclass
class Point:
    phase: str
    latencies_ms: list[float] = field(default_factory=list)
    refused: int = 0
    heavy_rows_s: list[float] = field(default_factory=list)  # per round
    cpu_busy: list[float] = field(default_factory=list)  # per round
    engine_busy: list[float] = field(default_factory=list)  # per round
    peer: bool = False  # its executions overlap: their seconds are no engine share

    def percentile(self, q: float) -> float:
        return float(np.percentile(self.latencies_ms, q)) if self.latencies_ms else float("nan")

    def add(self, other: Point) -> None:
        self.latencies_ms += other.latencies_ms
        self.refused += other.refused
        self.heavy_rows_s += other.heavy_rows_s
        self.cpu_busy += other.cpu_busy
        self.engine_busy += other.engine_busy

    def heavy(self) -> float:
        return float(np.mean(self.heavy_rows_s)) if self.heavy_rows_s else float("nan")

    def row(self, engine: str) -> str:
        spread = (
            f"{self.heavy():.0f} ({min(self.heavy_rows_s):.0f}-{max(self.heavy_rows_s):.0f})"
            if self.heavy_rows_s
            else "-"
        )
        return (
            f"| {engine} | {self.phase} | {self.percentile(50):.1f} | "
            f"{self.percentile(99):.1f} | {spread} | "
            f"{'-' if self.peer else f'{np.mean(self.engine_busy):.0%}'} | "
            f"{np.mean(self.cpu_busy):.0%} |"
        )


async def heavy_connection(
    url: str, model: str, rows: list[np.ndarray], priority: int, peer: bool
) -> None:
    """Keeps its rows in flight as requests of ``CHUNK`` rows, each sent again as soon as it is
    answered (a bulk job's pool of workers), in class ``priority``, until cancelled: the
    project's class parameter (as the body check hands it on), or the peer's own request
    priority."""
    client = grpcaio.InferenceServerClient(url)
    headers = {CLIENT_PARAMETER: "heavy"}
    named: dict[str, object] = {"priority": priority} if peer else {}
    if priority > 1 and not peer:
        named["parameters"] = {CLASS_PARAMETER: priority}

    async def back_to_back(inputs: list) -> None:
        while True:
            try:
                await client.infer(model, inputs, headers=headers, **named)
            except InferenceServerException:  # refused (the queue full): counted by the server
                await asyncio.sleep(0.01)

    try:
        await asyncio.gather(
            *(
                back_to_back(id_inputs("grpc", rows[a : a + CHUNK]))
                for a in range(0, HEAVY_ROWS, CHUNK)
            )
        )
    finally:
        await client.close()


def bulk_client(
    url: str,
    model: str,
    rows: list[np.ndarray],
    priority: int,
    peer: bool,
    ready: EventType,
    stop: EventType,
) -> None:
    """The bulk connections, in a process of their own (a client of its own, as a bulk job is:
    in the interactive clients' event loop, its bursts of answers and requests would hold
    theirs back); cancelled at ``stop``."""

    async def run() -> None:
        bulk = [
            asyncio.ensure_future(heavy_connection(url, model, rows, priority, peer))
            for _ in range(HEAVY_CONNECTIONS)
        ]
        ready.set()
        while not stop.is_set():
            await asyncio.sleep(0.05)
        for task in bulk:  # cancelled calls reach the model, which drops their rows unrun
            task.cancel()
        await asyncio.gather(*bulk, return_exceptions=True)

    asyncio.run(run())


@contextlib.asynccontextmanager
async def bulk_flood(
    url: str, model: str, rows: list[np.ndarray], priority: int, peer: bool
) -> AsyncIterator[multiprocessing.process.BaseProcess]:
    """The bulk client (``bulk_client``, sending the bench's rows in turn, ``HEAVY_ROWS`` a
    connection) running for the body, its queue full first; stopped on every exit, and named
    with its exit code where it fails."""
    spawn = multiprocessing.get_context("spawn")
    ready, stop = spawn.Event(), spawn.Event()
    process = spawn.Process(
        target=bulk_client,
        args=(
            url,
            model,
            [rows[i % len(rows)] for i in range(HEAVY_ROWS)],
            priority,
            peer,
            ready,
            stop,
        ),
        daemon=True,
    )
    process.start()
    try:
        if not await asyncio.to_thread(ready.wait, 60.0):
            raise BenchError(f"the bulk client did not start (exit code {process.exitcode})")
        await asyncio.sleep(2.0)  # the queue fills first
        yield process
        if not process.is_alive():
            raise BenchError(f"the bulk client ended early (exit code {process.exitcode})")
    finally:  # cancelled calls reach the model, which drops their rows unrun
        stop.set()
        await asyncio.to_thread(process.join, 30.0)
        if process.exitcode is None:
            process.kill()
    if process.exitcode != 0:
        raise BenchError(f"the bulk client did not stop cleanly (exit code {process.exitcode})")
    await asyncio.sleep(3.0)  # the forward running when they were cancelled ends


async def light_loop(url: str, model: str, row: np.ndarray, name: str, seconds: float) -> Point:
    """One interactive client's closed loop for ``seconds``: its latencies and refusals."""
    client = grpcaio.InferenceServerClient(url)
    inputs = id_inputs("grpc", [row])
    point = Point("")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                await client.infer(model, inputs, headers={CLIENT_PARAMETER: name})
                point.latencies_ms.append((time.perf_counter() - started) * 1e3)
            except InferenceServerException:
                point.refused += 1
                await asyncio.sleep(0.01)
    finally:
        await client.close()
    return point


def work_done(metrics_url: str, model: str, peer: bool) -> tuple[float, float]:
    """Rows the model's forwards computed (smooth, where answers come a request at a time), and
    their seconds; the peer's: rows of the requests it answered (Triton's count, a batch of n
    counting n) and the seconds its executions took."""
    samples = scrape(metrics_url)
    if peer:
        seconds = samples_of(samples, "nv_inference_compute_infer_duration_us", model=model)
        rows = samples_of(samples, "nv_inference_count", model=model)
        return sum(s.value for s in rows), sum(s.value for s in seconds) / 1e6
    seconds = samples_of(samples, "planner_forward_seconds_sum", model=model)
    rows = samples_of(samples, "planner_rows_total", model=model)
    return sum(s.value for s in rows), sum(s.value for s in seconds)


def busy_share(before: list[int], after: list[int]) -> float:
    spent = [b - a for a, b in zip(before, after, strict=True)]
    return 1 - (spent[3] + spent[4]) / max(1, sum(spent))  # idle, iowait


async def phase(
    server: TritonServer,
    model: str,
    rows: list[np.ndarray],
    name: str,
    light: bool,
    heavy: int,
    seconds: float,
    peer: bool = False,
) -> Point:
    """The interactive clients (if ``light``) for the phase's seconds beside the bulk client in
    class ``heavy`` (none if 0): their latencies, and the bulk rows computed a second."""
    metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
    point = Point(name, peer=peer)
    flood = bulk_flood(server.grpc_url, model, rows, heavy, peer) if heavy else None
    async with flood or contextlib.nullcontext():
        (computed, busy), started = work_done(metrics, model, peer), time.monotonic()
        cpu = cpu_times()
        loops = [
            light_loop(server.grpc_url, model, rows[k], f"light{k}", seconds)
            for k in range(LIGHT_CLIENTS if light else 0)
        ]
        for got in await asyncio.gather(*loops, asyncio.sleep(seconds)):
            if got is not None:
                point.add(got)
        point.cpu_busy.append(busy_share(cpu, cpu_times()))
        now_computed, now_busy = work_done(metrics, model, peer)
        elapsed = time.monotonic() - started
        point.engine_busy.append((now_busy - busy) / elapsed)
        if heavy:
            bulk_done = now_computed - computed - len(point.latencies_ms)
            point.heavy_rows_s.append(bulk_done / elapsed)
    return point


def priority_peer(repository: Path, name: str, table: str | None) -> str:
    """Triton's dynamic batcher with two priority levels over the same engine (bench.harness's
    peer): requests of token ids of any length batch together (ragged)."""
    config = add_model_variant(repository, "planner_dp", name, model_py=PEER_MODEL_PY)
    config.dynamic_batching.max_queue_delay_microseconds = PEER_QUEUE_DELAY_US
    config.dynamic_batching.priority_levels = 2
    config.dynamic_batching.default_priority_level = 1
    for tensor in config.input:
        tensor.allow_ragged_batch = tensor.name in ("INPUT_IDS", "ATTENTION_MASK")
    write_config(config, repository / name)
    if table is not None:
        (repository / name / "1" / TABLE_FILE).write_text(table + "\n")
    return name


def served(
    repository: Path, spec: str, rounds: int, classes: dict[str, str], seconds: float
) -> tuple[list[Point], float, float]:
    """The phases on one engine, pooled over rounds; its longest forward (ms); and the seconds
    an interactive row takes in a full forward."""
    source = repository / "planner_dp"
    model = "planner_fair_" + "".join(c if c.isalnum() else "_" for c in spec)
    table = None if spec == "real" else f"manifest:{source}" if spec == "manifest" else spec
    forward_s = cost_table(table or f"manifest:{source}")
    # the planner's cost model: the table's fixed cost, as calibration on that engine would find
    settings = {**classes, "overhead_tokens": f"{forward_s.fixed_tokens:.0f}"}
    if table is not None:  # the emulated engine stands for a GPU: forwards overlap the rest
        settings["overlap_forwards"] = "on"
    add_variant(repository, "planner_dp", model, table, parameters=settings)
    riders = model + "_riders"
    more = {**settings, "class_rider_factor": str(MORE_RIDERS)}
    add_variant(repository, "planner_dp", riders, table, parameters=more)
    peer = priority_peer(repository, model + "_peer", table)
    models = {"": model, "riders": riders, "peer": peer}
    served_layout = cost_table(f"manifest:{source}").layout  # the engine's, whatever the times
    longest_ms = 1e3 * max(
        forward_s.seconds(served_layout.max_rows(t), t) for t in served_layout.lengths
    )
    rows = request_rows(source / "1")
    # an interactive row's seconds in a full forward at its length: their own work's least cost
    lengths = [served_layout.pad_len(len(rows[k])) for k in range(LIGHT_CLIENTS)]
    light_s = float(
        np.mean(
            [
                forward_s.seconds(served_layout.max_rows(t), t) / served_layout.max_rows(t)
                for t in lengths
            ]
        )
    )
    points = {name: Point(name, peer=on == "peer") for name, _, _, on in PHASES}
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(
            repository,
            free_port(),
            free_port(),
            free_port(),
            log_path=Path(tmp) / "triton.log",
            extra_args=[
                *client_forward_args(),
                "--model-control-mode=explicit",
                f"--load-model={model}",
                f"--load-model={riders}",
                f"--load-model={peer}",
            ],
        )
        with server:
            for name in models.values():
                asyncio.run(phase(server, name, rows, "warm", True, 1, 2.0, name == peer))
            for r, (name, light, heavy, on) in alternating(PHASES, rounds):
                on_peer = on == "peer"
                got = asyncio.run(
                    phase(server, models[on], rows, name, light, heavy, seconds, on_peer)
                )
                print(f"{spec} round {r + 1}: {got.row(spec)}", flush=True)
                points[name].add(got)
    return list(points.values()), longest_ms, light_s


def simulated(wait_ms: float, rider_factor: float) -> str:
    """The simulator's table: each policy's interactive p50/p99 alone and beside the bulk, and
    the bulk's rows/s alone and beside the interactive clients; each run with ``SIM_SEEDS``
    (the rounds: the lengths and arrivals drawn again)."""
    lengths = read_lengths(LENGTHS)
    lines = [
        "| GPU table | batcher | interactive p50 / p99 ms alone (engine busy) | beside the bulk "
        "(p99 spread) | bound | bulk rows/s alone | beside the interactive (spread) |",
        "|---|---|---|---|---|---|---|",
    ]
    for gpu in ("a100", "a30"):
        table = gpu_table(gpu)
        full_ms = 1e3 * table.seconds(table.layout.max_batch, table.layout.lengths[-1])
        for label, policy, bulk_class, waits in SIM_POLICIES:
            wait = wait_ms if waits is None else waits[gpu]
            label = label.replace("GPU wait", f"wait {wait:g} ms")
            classes = (
                ServiceClasses(wait_s=wait / 1e3, rider_factor=rider_factor)
                if policy == "dp"
                else STRICT
            )
            bulk = Load(SIM_BULK.clients, SIM_BULK.rows, bulk_class, SIM_BULK.client)
            rounds = []
            for seed in SIM_SEEDS:
                run = functools.partial(
                    simulate,
                    lengths,
                    table,
                    policy,
                    seconds=5,
                    round_trip_us=SIM_ROUND_TRIP_US,
                    classes=classes,
                    seed=seed,
                    overlap=True,
                )
                alone = run(concurrency=LIGHT_CLIENTS)
                both = run(concurrency=LIGHT_CLIENTS, beside=bulk)
                bulk_alone = run(concurrency=0, beside=bulk)
                assert both.beside is not None and bulk_alone.beside is not None
                rounds.append((alone, both, bulk_alone.beside.rows_per_s, both.beside.rows_per_s))

            def mean(values: list[float]) -> float:
                return float(np.mean(values))

            p99s = [b.percentile_ms(99) for _, b, _, _ in rounds]
            bound = min(2 * a.percentile_ms(99) + min(full_ms, wait) for a, *_ in rounds)
            ratios = [beside / alone_rows for _, _, alone_rows, beside in rounds]
            lines.append(
                f"| {gpu} | {label} | {mean([a.percentile_ms(50) for a, *_ in rounds]):.2f} / "
                f"{mean([a.percentile_ms(99) for a, *_ in rounds]):.2f} "
                f"({mean([a.busy_s / a.seconds for a, *_ in rounds]):.0%}) | "
                f"{mean([b.percentile_ms(50) for _, b, _, _ in rounds]):.2f} / {mean(p99s):.2f} "
                f"({min(p99s):.2f}-{max(p99s):.2f}) | {bound:.2f} | "
                f"{mean([r[2] for r in rounds]):.0f} | {mean([r[3] for r in rounds]):.0f} "
                f"({mean(ratios):.2f}: {min(ratios):.2f}-{max(ratios):.2f}) |"
            )
            print(lines[-1], flush=True)
    return "\n".join(lines)


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--costs", default="table:a30*20,real")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repo")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/")
    parser.add_argument("--class-wait-ms", default=CONFIG_DEFAULTS["class_wait_ms"])
    parser.add_argument("--class-rider-factor", default=CONFIG_DEFAULTS["class_rider_factor"])
    args = parser.parse_args()
    if not float(args.class_rider_factor) >= 1:
        parser.error("--class-rider-factor must be a number >= 1")
    repository, _ = build_repository(args.repository, rebuild=False)
    sim_table = simulated(float(args.class_wait_ms), float(args.class_rider_factor))
    class_settings = {
        "class_wait_ms": args.class_wait_ms,
        "class_rider_factor": args.class_rider_factor,
    }
    lines = [
        "| engine | phase | interactive p50 ms | p99 ms | bulk rows/s (spread) | engine busy | "
        "CPU busy |",
        "|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for spec in args.costs.split(","):
        points, longest_ms, light_s = served(
            repository, spec, args.rounds, class_settings, args.seconds
        )
        lines += [p.row(spec) for p in points]
        by = {p.phase: p for p in points}
        bound = 2 * by["interactive alone"].percentile(99) + min(
            longest_ms, float(args.class_wait_ms)
        )
        classes, peer, more = by["classes"], by["peer: priority levels"], by[MORE]
        alone = by["bulk alone"].heavy()
        interactive_rows_s = len(classes.latencies_ms) / (args.seconds * args.rounds)
        verdicts.append(
            f"- {spec}: interactive p99 with classes {classes.percentile(99):.1f} ms, bound "
            f"{bound:.1f}; bulk beside the interactive clients {classes.heavy() / alone:.2f} "
            f"of alone with classes ({classes.heavy() / peer.heavy():.1f}x the peer's); with "
            f"class_rider_factor {MORE_RIDERS}: p99 {more.percentile(99):.1f} ms, bulk "
            f"{more.heavy() / alone:.2f} of alone; interactive alone: engine "
            f"{np.mean(by['interactive alone'].engine_busy):.0%}; "
            f"interactive beside: {interactive_rows_s:.0f} rows/s, their own work "
            f"{interactive_rows_s * light_s:.0%} of the engine even in full forwards; "
            f"{sum(p.refused for p in points)} refused"
        )
    text = render(
        "fairness",
        costs=args.costs,
        seconds=f"{args.seconds:g}",
        rounds=args.rounds,
        wait=args.class_wait_ms,
        riders=args.class_rider_factor,
        light=LIGHT_CLIENTS,
        table="\n".join(lines),
        verdicts="\n".join(verdicts),
        sim_bulk=SIM_BULK.clients,
        round_trip=f"{SIM_ROUND_TRIP_US / 1e3:g}",
        sim_table=sim_table,
        seeds=len(SIM_SEEDS),
    )
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
