"""The serving comparison, one command: the planner beside Triton's dynamic batcher, and the
layouts, routes and peers around it, on the real Triton server.

    python -m bench.serving [--concurrency 1,2,4,8,16,32,64] [--measurement-ms 4000] [--rounds 3]
    python -m bench.serving --layouts one,instances:2,fronts:1,fronts:2,floor [--pin-cores both]
                            [--inputs text,ids] [--rows-per-request 1] [--emulated zero|none]
                            [--baseline-tree DIR]
    python -m bench.serving --route door,v1 | --peer infinity

By default one server holds three models over the same engine files: planner_dp (this project:
its queue, the DP planner, bucketed forwards), planner_per_bucket (grouping by bucket) and
dynamic_batcher (Triton's dynamic batcher, a batch padded to its longest row). perf_analyzer
sends each the same real-text rows, one a request, at each concurrency, then at half the peer's
peak rate; both routes follow. The engine-only limit runs the same rows with no server. Each
report goes to its section of docs/PERFORMANCE.md, the plot to docs/serving_throughput_p99.png.

Each option instead measures one thing:
- ``--layouts``: a server for each layout, over the emulated engine (zero: the server's ceiling
  at GPU speed; none: the bench model's ONNX engine): ``one`` process, ``instances:N``,
  ``fronts:N`` (the split layout), ``floor`` (bench.emulated_model.PythonBackendFloorModel); CPU
  and context switches per request by process, from /proc; with ``--baseline-tree DIR`` each is
  also served by DIR's code (``--layouts one --emulated none``: planner_dp beside an earlier
  commit);
- ``--route door``: gRPC direct, through the door without the body check, and through the front
  door; ``--route v1``: ``/v1/embeddings`` against KServe ``infer``, one aiohttp client;
- ``--peer infinity``: Infinity 0.0.78 (installed into build/infinity-venv on first use) beside
  our ``/v1`` and the dynamic batcher, the same client.
What is compared alternates in an order that flips every round, so the shared machine's drift
falls on all alike. Layouts are printed, not written.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

from bench.docs import publish, render, save_figure
from bench.errors import BenchError, reports_errors
from bench.harness import (
    MODELS,
    PEER,
    PEER_QUEUE_DELAY_US,
    MachineLoad,
    add_variant,
    alternating,
    build_repository,
    measure,
    request_rows,
    request_texts,
    token_id_input_data,
    warm_up,
)
from bench.paths import INPUT_DATA, ROOT
from bench.sim.validation import forward_stats, forwards_between
from builder.triton_config import add_model_variant
from python_backend.common.contract import OWNER_SUFFIX
from tools.front_door import FrontDoor, FrontDoorSettings
from tools.helpers import body_check, openai_adapter
from tools.perf_analyzer import PerfPoint
from tools.serve import child_stubs, stub_model
from tools.triton_server import TritonServer, answers_ok, free_port

MODEL = "planner_dp"  # what the routes, the layouts and the code comparison serve
PLOT = ROOT / "docs" / "serving_throughput_p99.png"
SECTIONS = {  # each report's markers in docs/PERFORMANCE.md
    "serving": ("<!-- serving:begin -->", "<!-- serving:end -->"),
    "door": ("<!-- front-door:begin -->", "<!-- front-door:end -->"),
    "v1": ("<!-- openai:begin -->", "<!-- openai:end -->"),
    "infinity": ("<!-- infinity:begin -->", "<!-- infinity:end -->"),
}
DOOR_ROUTES = ("direct", "door, no body check", "front door")
V1_ROUTES = ("KServe /v2 infer", "OpenAI /v1/embeddings")
INFINITY_VENV = ROOT / "build" / "infinity-venv"
INFINITY_PACKAGES = ["infinity-emb[server,torch]==0.0.78", "torch==2.13.0"]
LOGS = itertools.count()
THIS, BASELINE = "this checkout", "baseline"  # whose code serves, where two checkouts do


@dataclass(frozen=True)
class Run:
    """One measurement: its round, concurrency, what it measured (a model, route or code) and a
    note where it is not clean ("unstable": windows never settled; "N errors": refusals)."""

    round: int
    concurrency: int
    name: str
    point: PerfPoint
    note: str = ""

    def mark(self) -> str:
        return f" ({self.note})" if self.note else ""


def mean(runs: list[Run], name: str, field: str = "rows_per_s", concurrency: int = 0) -> float:
    """The mean of the point's ``field`` over ``name``'s runs (at ``concurrency``, unless 0)."""
    picked = [r for r in runs if r.name == name and concurrency in (0, r.concurrency)]
    return float(np.mean([getattr(r.point, field) for r in picked]))


@dataclass(frozen=True)
class Setup:
    """What one command line's measurements share: the bench repository, a scratch folder, the
    concurrencies, each measurement's length and the rounds of each alternation."""

    repository: Path
    tmp: Path
    levels: list[int]
    ms: int
    rounds: int
    load: MachineLoad = field(default_factory=MachineLoad)

    @contextlib.contextmanager
    def triton(self, models: Sequence[str], code_root: Path = ROOT) -> Iterator[TritonServer]:
        """A server loading only ``models``, whose models import ``code_root``'s python_backend."""
        log = self.tmp / f"triton-{next(LOGS)}.log"
        server = TritonServer.loading_only(self.repository, tuple(models), log, code_root)
        try:
            server.start()
            server.wait_ready()
        except (RuntimeError, TimeoutError) as err:
            server.stop()
            tail = log.read_text(errors="replace")[-6000:]
            raise BenchError(f"{models} did not start ({err}); the log:\n{tail}") from None
        try:
            yield server
        finally:
            server.stop()

    def alternate(
        self, names: Sequence[str], one: Measure, levels: Sequence[int] = (), rounds: int = 0
    ) -> list[Run]:
        """``one(name, concurrency)`` for every name at every concurrency (``levels``, else the
        command's), ``rounds`` times (else the command's), in ``harness.alternating``'s order."""
        out = []
        variants = [(c, n) for c in levels or self.levels for n in names]
        for r, (c, name) in alternating(variants, rounds or self.rounds):
            point, note = one(name, c)
            out.append(Run(r, c, name, point, note))
            print(
                f"round {r + 1} c={c:>3} {name:<30} {point.rows_per_s:8.1f} rows/s  p50 "
                f"{point.p50_ms:8.1f}  p99 {point.p99_ms:8.1f} ms{out[-1].mark()}",
                flush=True,
            )
        return out


Measure = Callable[[str, int], tuple[PerfPoint, str]]  # (name, concurrency) -> (point, note)


# -- the default: the three models across concurrencies ------------------------------------------


def engine_only_limit(version_dir: Path, rows: list[np.ndarray], collection: int) -> float:
    """Rows/s of the same rows run twice through the scheduler's own step, in collections of
    ``collection`` rows, with no server: the planner's forwards on the engine, nothing else."""
    from python_backend.common.manifest import load_manifest
    from python_backend.engines import open_engine
    from python_backend.scheduling.records import Request
    from python_backend.scheduling.scheduler import Scheduler

    manifest = load_manifest(version_dir)
    engine = open_engine(manifest, version_dir)
    scheduler = Scheduler(
        engine, manifest.pad_token_id, manifest.planner_cost(), manifest.max_batch, len(rows)
    )
    started = time.perf_counter()
    for _ in range(2):
        for a in range(0, len(rows), collection):
            for row in rows[a : a + collection]:
                scheduler.submit(Request([row], respond=lambda outcome: None))
            scheduler.step()
    seconds = time.perf_counter() - started
    engine.close()
    return 2 * len(rows) / seconds


def histogram(lengths: list[int]) -> str:
    lines = ["| tokens | rows | share |", "|---|---|---|"]
    arr = np.asarray(lengths)
    for lo, hi in itertools.pairwise([0, 16, 32, 64, 128, 192, 256]):
        n = int(((arr > lo) & (arr <= hi)).sum())
        lines.append(f"| {lo + 1}-{hi} | {n} | {n / len(arr):.0%} |")
    return "\n".join(lines)


def plot(runs: list[Run], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model in MODELS:
        points = [r for r in runs if r.name == model]
        xs, ys = [r.point.p99_ms for r in points], [r.point.rows_per_s for r in points]
        ax.plot(xs, ys, marker="o", label=model)
        for r in points:
            xy = (r.point.p99_ms, r.point.rows_per_s)
            ax.annotate(
                str(r.concurrency), xy, fontsize=7, textcoords="offset points", xytext=(3, 3)
            )
    ax.set_xscale("log")
    ax.set_xlabel("p99 latency (ms, log scale); labels: concurrency")
    ax.set_ylabel("throughput (rows/s)")
    ax.set_title("MiniLM on ONNX Runtime (2 CPU cores), real-text rows")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    save_figure(fig, path)


def report(
    runs: list[Run],
    limit: float,
    lengths: list[int],
    build_summary: list[str],
    levels: list[int],
    ms: int,
    half_rate: float,
    at_half: list[Run],
    load: MachineLoad,
) -> str:
    mean_tokens = float(np.mean(lengths))
    table = [
        "| concurrency | model | rows/s | real tokens/s | p50 ms | p90 ms | p99 ms "
        "| rows/s vs peer | p99 vs peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in levels:
        peer = next(r.point for r in runs if r.concurrency == c and r.name == PEER)
        for model in MODELS:
            run = next(r for r in runs if r.concurrency == c and r.name == model)
            p = run.point
            table.append(
                f"| {c} | {model} | {p.rows_per_s:.1f} | {p.rows_per_s * mean_tokens:.0f} | "
                f"{p.p50_ms:.0f} | {p.p90_ms:.0f} | {p.p99_ms:.0f} | "
                f"{p.rows_per_s / peer.rows_per_s:.2f}x | {p.p99_ms / peer.p99_ms:.2f}x |"
                + run.mark()
            )
    peer_p99 = next(r.point.p99_ms for r in at_half if r.name == PEER)
    half = ["| model | p50 ms | p99 ms | p99 vs peer |", "|---|---|---|---|"] + [
        f"| {r.name} | {r.point.p50_ms:.0f} | {r.point.p99_ms:.0f} | "
        f"{r.point.p99_ms / peer_p99:.2f}x |" + r.mark()
        for r in at_half
    ]
    best = max(r.point.rows_per_s for r in runs if r.name == MODEL)
    return render(
        "serving",
        levels=",".join(map(str, levels)),
        ms=ms,
        machine=platform.machine(),
        cores=os.cpu_count(),
        peer_delay_us=PEER_QUEUE_DELAY_US,
        build_summary="\n".join("    " + line for line in build_summary),
        rows=len(lengths),
        mean_tokens=f"{mean_tokens:.1f}",
        histogram=histogram(lengths),
        table="\n".join(table),
        collection=max(levels),
        limit=f"{limit:.1f}",
        limit_tokens=f"{limit * mean_tokens:.0f}",
        efficiency=f"{best / limit:.0%}",
        half_rate=f"{half_rate:.1f}",
        half_load_table="\n".join(half),
        machine_load=load.describe(),
    )


def sweep(s: Setup, build_summary: list[str], write: bool) -> dict[str, str]:
    """The three models at each concurrency and at half the peer's peak, then both routes; the
    plot written where ``write``."""
    rows = request_rows(s.repository / MODEL / "1")
    lengths = [len(r) for r in rows]
    print("\n".join(build_summary))
    print(
        f"{len(rows)} requests of one row; tokens: mean {np.mean(lengths):.1f}, median "
        f"{np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, max {max(lengths)}"
    )
    limit = engine_only_limit(s.repository / MODEL / "1", rows, collection=max(s.levels))
    print(f"engine-only limit: {limit:.1f} rows/s")
    with s.triton(MODELS) as server:
        warm_up(server, s.tmp, MODELS)
        url = server.grpc_url
        runs = s.alternate(MODELS, lambda m, c: measure(m, url, c, s.tmp, s.ms), rounds=1)
        # the same offered load for both: half the peer's peak, which both can sustain
        half = 0.5 * max(r.point.rows_per_s for r in runs if r.name == PEER)
        print(f"half the peer's peak: {half:.1f} requests/s")
        at_half = s.alternate(
            (MODEL, PEER), lambda m, c: measure(m, url, c, s.tmp, s.ms, rate=half), [1], 1
        )
        sections = routes(s, server, ("door", "v1"), 64)
    if write:
        plot(runs, PLOT)
    text = report(runs, limit, lengths, build_summary, s.levels, s.ms, half, at_half, s.load)
    return {"serving": text, **sections}


# -- the routes: the front door's cost and the OpenAI route's --------------------------------------


@contextlib.contextmanager
def front_doors(
    server: TritonServer, tmp: Path, adapter: bool, plain: bool = False
) -> Iterator[tuple[FrontDoorSettings, FrontDoorSettings]]:
    """The front door on loopback before ``server``, as the launcher runs it: the body check in
    front of the inference calls and, with ``adapter``, the OpenAI adapter for MODEL. The second
    door, with ``plain``, sends its inference calls straight to Triton (the door before the body
    check); without, it is the first."""
    triton_http, triton_grpc = f"127.0.0.1:{server.http_port}", f"127.0.0.1:{server.grpc_port}"
    check, openai = (free_port(), free_port(), free_port()), free_port()

    def door(check_ports: tuple[int, int, int] | None) -> FrontDoorSettings:
        http, grpc, stream = check_ports or (server.http_port, server.grpc_port, server.grpc_port)
        return FrontDoorSettings(
            triton_http_address=triton_http,
            triton_grpc_address=triton_grpc,
            triton_metrics_address=f"127.0.0.1:{server.metrics_port}",
            openai_address=f"127.0.0.1:{openai}",
            check_http_address=f"127.0.0.1:{http}",
            check_grpc_address=f"127.0.0.1:{grpc}",
            check_stream_address=f"127.0.0.1:{stream}",
            public_address="127.0.0.1",
            http_port=free_port(),
            grpc_port=free_port(),
            metrics_port=free_port(),
        )

    with contextlib.ExitStack() as stack:
        if adapter:
            helper = openai_adapter(triton_grpc, openai, [MODEL], tmp / "openai.log")
            stack.callback(helper.start().stop)
        checker = body_check(
            triton_http, triton_grpc, *check, FrontDoorSettings.max_body_size, tmp / "check.log"
        )
        stack.callback(checker.start().stop)
        doors = [door(check)] + ([door(None)] if plain else [])
        for k, settings in enumerate(doors):
            stack.enter_context(FrontDoor(settings, tmp / f"front-door-{k}"))
        yield doors[0], doors[-1]


def kserve_body(text: str) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    ).encode()


def openai_body(text: str) -> bytes:
    return json.dumps({"model": MODEL, "input": text, "encoding_format": "float"}).encode()


def infinity_body(text: str) -> bytes:
    return json.dumps({"model": "minilm", "input": [text]}).encode()


Route = tuple[str, Callable[[str], bytes]]  # an HTTP route: its URL, a request's body for a text


async def closed_loop(
    route: Route, concurrency: int, seconds: float, warmup_s: float = 1.0
) -> tuple[PerfPoint, str]:
    """``concurrency`` workers, each sending one real-text row at a time and parsing the answer:
    rows/s and the latency of the answered requests, counted after ``warmup_s``."""
    url, body = route
    texts = request_texts()
    latencies: list[float] = []
    errors = 0
    measure_from = time.perf_counter() + warmup_s
    end = measure_from + seconds
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(k: int) -> None:
            nonlocal errors
            while (now := time.perf_counter()) < end:
                payload = body(texts[k % len(texts)])
                k += concurrency
                async with session.post(url, data=payload, headers=headers) as response:
                    answer = await response.read()
                    ok = response.status == 200
                json.loads(answer)
                if now >= measure_from:
                    if ok:
                        latencies.append((time.perf_counter() - now) * 1e3)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    q = np.percentile(latencies, (50, 90, 99)) if latencies else [float("nan")] * 3
    point = PerfPoint(len(latencies) / seconds, *map(float, q))
    return point, f"{errors} errors" if errors else ""


def http(route: Route, concurrency: int, seconds: float) -> tuple[PerfPoint, str]:
    return asyncio.run(closed_loop(route, concurrency, seconds))


def routes(s: Setup, server: TritonServer, which: Sequence[str], c: int) -> dict[str, str]:
    """The reports of ``which`` routes ("door", "v1") of planner_dp at concurrency ``c``."""
    out = {}
    with front_doors(server, s.tmp, adapter="v1" in which, plain="door" in which) as (door, plain):
        if "door" in which:
            grpc = (server.grpc_url, f"127.0.0.1:{plain.grpc_port}", f"127.0.0.1:{door.grpc_port}")
            urls = dict(zip(DOOR_ROUTES, grpc, strict=True))
            runs = s.alternate(
                DOOR_ROUTES, lambda n, c: measure(MODEL, urls[n], c, s.tmp, s.ms), levels=[c]
            )
            direct, no_check, checked = (mean(runs, name) for name in DOOR_ROUTES)
            out["door"] = render(
                "front_door",
                ms=s.ms,
                concurrency=c,
                table=rounds_table(runs),
                direct=f"{direct:.1f}",
                plain=f"{no_check:.1f}",
                door=f"{checked:.1f}",
                ratio=f"{checked / direct:.3f}x",
                check_ratio=f"{checked / no_check:.3f}x",
            )
        if "v1" in which:
            base = f"http://127.0.0.1:{door.http_port}"
            v1: dict[str, Route] = {
                V1_ROUTES[0]: (f"{base}/v2/models/{MODEL}/infer", kserve_body),
                V1_ROUTES[1]: (f"{base}/v1/embeddings", openai_body),
            }
            runs = s.alternate(V1_ROUTES, lambda n, c: http(v1[n], c, s.ms / 1000), levels=[c])
            kserve, openai = (mean(runs, name) for name in V1_ROUTES)
            out["v1"] = render(
                "openai_cost",
                concurrency=c,
                seconds=f"{s.ms / 1000:g}",
                rounds=s.rounds,
                model=MODEL,
                table=rounds_table(runs),
                kserve=f"{kserve:.1f}",
                openai=f"{openai:.1f}",
                ratio=f"{openai / kserve:.3f}x",
            )
    return out


def rounds_table(runs: list[Run]) -> str:
    return "\n".join(
        ["| round | route | rows/s | p50 ms | p99 ms |", "|---|---|---|---|---|"]
        + [
            f"| {r.round + 1} | {r.name} | {r.point.rows_per_s:.1f} | {r.point.p50_ms:.0f} | "
            f"{r.point.p99_ms:.0f} |" + r.mark()
            for r in runs
        ]
    )


# -- a served peer: Infinity ---------------------------------------------------------------------


@contextlib.contextmanager
def infinity(port: int, log: Path) -> Iterator[None]:
    """Infinity serving the bench's MiniLM on loopback ``port`` (installed on first use)."""
    from builder.build import default_model_dir

    model_dir = default_model_dir()
    if model_dir is None:
        raise BenchError("the MiniLM package is missing: run make setup")
    binary = INFINITY_VENV / "bin" / "infinity_emb"
    if not binary.is_file():
        print(f"installing {' '.join(INFINITY_PACKAGES)} into {INFINITY_VENV} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(INFINITY_VENV)], check=True)
        pip = str(INFINITY_VENV / "bin" / "pip")
        subprocess.run([pip, "install", "--quiet", *INFINITY_PACKAGES], check=True)
    command = [str(binary), "v2", "--model-id", str(model_dir), "--served-model-name", "minilm"]
    command += ["--engine", "torch", "--device", "cpu", "--batch-size", "64"]
    command += ["--port", str(port), "--host", "127.0.0.1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    process = subprocess.Popen(command, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while not answers_ok(f"http://127.0.0.1:{port}/health"):
            if process.poll() is not None or time.monotonic() > deadline:
                raise BenchError(f"Infinity did not start: {log.read_text()[-1500:]}")
            time.sleep(0.5)
        yield
    finally:
        process.terminate()
        process.wait(timeout=20)


def infinity_peer(s: Setup) -> str:
    """This project's /v1 and the dynamic batcher through the front door, and Infinity on its own
    port, one server working at a time, the others idle."""
    port = free_port()
    with (
        s.triton((MODEL, PEER)) as server,
        front_doors(server, s.tmp, adapter=True) as (door, _),
        infinity(port, s.tmp / "infinity.log"),
    ):
        warm_up(server, s.tmp, (MODEL, PEER))
        base = f"http://127.0.0.1:{door.http_port}"
        peers: dict[str, Route] = {
            "this project, /v1/embeddings": (f"{base}/v1/embeddings", openai_body),
            "Triton dynamic batcher, infer": (f"{base}/v2/models/{PEER}/infer", kserve_body),
            "Infinity 0.0.78, /embeddings": (f"http://127.0.0.1:{port}/embeddings", infinity_body),
        }
        for route in peers.values():  # each warmed once
            asyncio.run(closed_loop(route, 8, 2.0, warmup_s=0.5))
        runs = s.alternate(list(peers), lambda n, c: http(peers[n], c, s.ms / 1000))
    names = list(peers)
    table = [
        "| concurrency | " + " | ".join(f"{n}: rows/s, p50, p99 ms" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in s.levels:
        cells = [
            f"{mean(runs, n, 'rows_per_s', c):.1f}, {mean(runs, n, 'p50_ms', c):.0f}, "
            f"{mean(runs, n, 'p99_ms', c):.0f}"
            for n in names
        ]
        table.append(f"| {c} | " + " | ".join(cells) + " |")
    ours, other = names[0], names[-1]
    ratios = [
        f"{mean(runs, ours, concurrency=c) / mean(runs, other, concurrency=c):.2f}x at {c}"
        for c in s.levels
    ]
    return render(
        "infinity_peer",
        levels=",".join(map(str, s.levels)),
        seconds=f"{s.ms / 1000:g}",
        rounds=s.rounds,
        table="\n".join(table),
        ratios=", ".join(ratios),
        machine_load=s.load.describe(),
    )


# -- the layouts: one process, instances, fronts, the Python backend's floor ------------------------

LAYOUT = re.compile(r"one|floor|(instances|fronts):[1-9][0-9]*")
FLOOR_MODEL_PY = (
    '"""Bench only: the Python backend floor (bench.emulated_model), not the project model."""\n'
    "from bench.emulated_model import PythonBackendFloorModel as TritonPythonModel\n\n"
    '__all__ = ["TritonPythonModel"]\n'
)
# a measured variant: its layout, whether its processes are pinned (pin_cores), whose code,
# what its clients send
Variant = tuple[str, bool, str, str]


@dataclass(frozen=True)
class Served:
    rows_per_s: float
    p99_ms: float
    note: str
    cpu_us_per_request: dict[str, float]  # by process role: triton, front(s), owner, model
    switches_per_request: dict[str, float]  # context switches, by process role
    rows_per_forward: float  # what the planners made of the rows they saw


def parse_layouts(text: str) -> list[str]:
    layouts = [x for x in text.split(",") if x]
    if not layouts or not all(LAYOUT.fullmatch(x) for x in layouts):
        raise argparse.ArgumentTypeError("name one, instances:N, fronts:N or floor")
    return layouts


def label(layout: str) -> str:
    kind, _, n = layout.partition(":")
    if kind == "fronts":
        return f"{n} front{'s' if n != '1' else ''}"
    return {"one": "one process", "floor": "Python-backend floor"}.get(kind, f"{n} instances")


def variant_label(key: Variant, compared: bool) -> str:
    layout, pinned, code, inputs = key
    parts = [label(layout)] + ["pinned"] * pinned + ["token ids"] * (inputs == "ids")
    return ", ".join(parts + [code] * compared)


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads."""
    import psutil

    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def context_switches(pid: int) -> int:
    """Context switches of every thread of a process so far, voluntary or not (0 once gone).
    Summed over /proc/PID/task: /proc/PID/status (what psutil reads) counts the main thread's
    only, and the stubs' switches are in their other threads."""
    total = 0
    for status in Path(f"/proc/{pid}/task").glob("*/status"):
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended
            fields = [line.split() for line in status.read_text().splitlines()]
            total += sum(int(f[1]) for f in fields if f and f[0].endswith("ctxt_switches:"))
    return total


def stub_role(pid: int) -> str:
    """A stub's role, from the model entry it serves (the variants' names say which)."""
    model = stub_model(pid) or "?"
    return "owner" if model.endswith(OWNER_SUFFIX) else "front" if "_split" in model else "model"


def variant(repository: Path, layout: str, table: str, pinned: bool) -> tuple[str, ...]:
    """The models that serve ``layout``, added to ``repository``; ``pinned``: with the
    ``pin_cores`` setting on. ``table`` "none": the bench model's own ONNX Runtime engine."""
    pinning = {"pin_cores": "on" if pinned else "off"}
    suffix = "_pinned" if pinned else ""
    kind, _, n = layout.partition(":")
    if kind == "floor":
        name = "python_backend_floor" + suffix
        add_model_variant(repository, MODEL, name, pinning, model_py=FLOOR_MODEL_PY)
        return (name,)
    engine, count, split = None if table == "none" else table, int(n or 1), kind == "fronts"
    name = f"{'emulated' if engine else 'engine'}_{'split' if split else 'x'}{count}{suffix}"
    return add_variant(repository, MODEL, name, engine, count, count if split else 0, pinning)


def serve_layout(s: Setup, key: Variant, rows: int, table: str, code_root: Path) -> Served:
    """One measurement of one variant at the command's concurrency, in a server of its own whose
    models import ``code_root``'s python_backend."""
    layout, pinned, _, inputs = key
    models = variant(s.repository, layout, table, pinned)
    model, requests, c = models[0], INPUT_DATA, s.levels[0]
    if inputs == "ids":
        requests = s.tmp / "token_ids.json"
        if not requests.is_file():
            token_id_input_data(s.repository / MODEL / "1", requests)
    with s.triton(models, code_root) as server:
        assert server.process is not None
        warm_up(server, s.tmp, (model,), c)
        triton_pid = server.process.pid
        pids = {triton_pid: "triton"} | {p: stub_role(p) for p in child_stubs(triton_pid)}
        metrics = f"http://127.0.0.1:{server.metrics_port}/metrics"
        forwards_before = forward_stats(metrics, model)
        before = {pid: (cpu_seconds(pid), context_switches(pid)) for pid in pids}
        started = time.monotonic()
        point, note = measure(model, server.grpc_url, c, s.tmp, s.ms, None, rows, requests)
        wall = time.monotonic() - started
        time.sleep(0.6)  # the models publish their metrics every 0.25 s
        done = forwards_between(forwards_before, forward_stats(metrics, model)).values()
        spent: dict[str, float] = defaultdict(float)
        switched: dict[str, float] = defaultdict(float)
        for pid, role in pids.items():
            spent[role] += cpu_seconds(pid) - before[pid][0]
            switched[role] += context_switches(pid) - before[pid][1]
    requests_per_s = point.rows_per_s / rows
    per_request = {role: x / wall / requests_per_s * 1e6 for role, x in spent.items()}
    switches = {role: n / wall / requests_per_s for role, n in switched.items()}
    forwards = sum(bucket["forwards"] for bucket in done)
    per_forward = sum(b["rows"] for b in done) / forwards if forwards else float("nan")
    return Served(point.rows_per_s, point.p99_ms, note, per_request, switches, per_forward)


def compare_layouts(s: Setup, args: argparse.Namespace) -> str:
    """Every layout, pinned or not, by each code, for each kind of client, alternating."""
    inputs = args.inputs.split(",")
    compared = args.baseline_tree is not None
    codes = ({BASELINE: args.baseline_tree.resolve()} if compared else {}) | {THIS: ROOT}
    pins = {"off": (False,), "on": (True,), "both": (False, True)}[args.pin_cores]
    # the floor is no checkout's model: served by this checkout's bench module alone
    variants: list[Variant] = [
        (layout, pinned, code, kind)
        for layout in args.layouts
        for pinned in pins
        for code in codes
        for kind in inputs
        if layout != "floor" or code == THIS
    ]
    results: dict[Variant, list[Served]] = defaultdict(list)
    table, rows = args.emulated, args.rows_per_request
    for r, key in alternating(variants, s.rounds):
        served = serve_layout(s, key, rows, table, codes[key[2]])
        results[key].append(served)
        shares = ", ".join(
            f"{k} {v:.0f} ({served.switches_per_request[k]:.1f} switches)"
            for k, v in sorted(served.cpu_us_per_request.items())
        )
        print(
            f"round {r + 1} {variant_label(key, compared):<12} {served.rows_per_s:8.0f} rows/s  "
            f"p99 {served.p99_ms:6.0f} ms  rows/forward {served.rows_per_forward:5.1f}  "
            f"CPU us/request: {shares}" + (f" ({served.note})" if served.note else ""),
            flush=True,
        )
    first = results[variants[0]]  # what the others are compared with
    base = float(np.mean([x.rows_per_s for x in first]))
    base_cpu = float(np.mean([sum(x.cpu_us_per_request.values()) for x in first]))
    versus = variant_label(variants[0], compared)
    lines = [
        f"c={s.levels[0]}, {rows} row(s) a request as {args.inputs}, engine {table}, "
        f"means of {s.rounds} rounds:\n",
        f"| layout | rows/s (each round) | mean rows/s | vs {versus} | rows per forward "
        f"| server CPU us/request (by process) | CPU vs {versus} "
        "| context switches/request (by process) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for key in variants:
        runs = results[key]
        rate = float(np.mean([x.rows_per_s for x in runs]))
        roles = sorted({k for x in runs for k in x.cpu_us_per_request})
        cpu, switch = (
            {k: float(np.mean([getattr(x, field).get(k, 0.0) for x in runs])) for k in roles}
            for field in ("cpu_us_per_request", "switches_per_request")
        )
        per_forward = float(np.mean([x.rows_per_forward for x in runs]))
        forwards = "-" if np.isnan(per_forward) else f"{per_forward:.1f}"  # the floor plans none
        lines.append(
            f"| {variant_label(key, compared)} | {', '.join(f'{x.rows_per_s:.0f}' for x in runs)} "
            f"| {rate:.0f} | {rate / base:.2f}x | {forwards} | {sum(cpu.values()):.0f} "
            f"({', '.join(f'{k} {v:.0f}' for k, v in cpu.items())}) "
            f"| {sum(cpu.values()) / base_cpu:.2f}x | {sum(switch.values()):.1f} "
            f"({', '.join(f'{k} {v:.1f}' for k, v in switch.items())}) |"
        )
    return "\n".join(lines)


# -- the command line --------------------------------------------------------------------------------


def arguments(argv: list[str] | None) -> tuple[argparse.Namespace, list[int]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", help="default 1,2,4,8,16,32,64; --peer 8,32,64; else 64")
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds of every alternation")
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the bench model")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--layouts", type=parse_layouts, help="one, instances:N, fronts:N, floor")
    only.add_argument("--route", help="door, v1 or door,v1: only these routes' cost")
    only.add_argument("--peer", choices=("infinity",), help="only this served peer beside ours")
    layouts = parser.add_argument_group("with --layouts")
    layouts.add_argument("--baseline-tree", type=Path, help="another checkout, to serve it too")
    layouts.add_argument(
        "--emulated",
        default="zero",
        help="the engine: an emulated one's forward time (zero, table:a30, ...) or none (ONNX)",
    )
    layouts.add_argument("--pin-cores", choices=("off", "on", "both"), default="off")
    layouts.add_argument(
        "--inputs",
        default="text",
        choices=("text", "ids", "text,ids"),
        metavar="text|ids|text,ids",
        help="what the clients send: text, its rows as token ids (one row a request), or both",
    )
    layouts.add_argument("--rows-per-request", type=int, default=1)
    args = parser.parse_args(argv)
    default = "64" if args.layouts or args.route else "8,32,64" if args.peer else "1,2,4,8,16,32,64"
    levels = [int(c) for c in (args.concurrency or default).split(",")]
    if (args.layouts or args.route) and len(levels) != 1:
        parser.error("--layouts and --route measure at one --concurrency")
    if args.route and not set(args.route.split(",")) <= {"door", "v1"}:
        parser.error(f"--route {args.route!r}: door, v1 or door,v1")
    layout_options = (args.pin_cores, args.inputs, args.rows_per_request, args.emulated)
    if not args.layouts and (layout_options != ("off", "text", 1, "zero") or args.baseline_tree):
        parser.error(
            "--pin-cores, --inputs, --rows-per-request, --emulated and --baseline-tree go with --layouts"
        )
    if "ids" in args.inputs and args.rows_per_request != 1:
        parser.error("--inputs ids sends one row a request (rows of different lengths)")
    if args.baseline_tree and not (args.baseline_tree / "python_backend").is_dir():
        parser.error(f"--baseline-tree {args.baseline_tree} is not a checkout of this project")
    return args, levels


@reports_errors
def main(argv: list[str] | None = None) -> int:
    args, levels = arguments(argv)
    repository, build_summary = build_repository(args.repository, args.rebuild)
    sections: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        s = Setup(repository, Path(tmp), levels, args.measurement_ms, args.rounds)
        if args.layouts:
            print(compare_layouts(s, args))
        elif args.peer:
            sections["infinity"] = infinity_peer(s)
        elif args.route:
            with s.triton((MODEL,)) as server:
                warm_up(server, s.tmp, (MODEL,), levels[0])
                sections = routes(s, server, args.route.split(","), levels[0])
        else:
            sections = sweep(s, build_summary, write=not args.no_write)
    for section, text in sections.items():
        print()
        publish(text, *SECTIONS[section], write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
