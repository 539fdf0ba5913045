"""The queue owner alone: no Triton, requests from another process over the owner's socket.

    python -m bench.owner_alone [--rows-per-request 1,64] [--feeders 1,2] [--clients 64]
                                [--seconds 5] [--rounds 3]

The owner (``python_backend.queue_owner`` over the scheduler, a zero-time engine of a default
TensorRT build's layout, 384 outputs a row) runs in its own process pinned to core 0 with
``taskset``. Feeder processes pinned to core 1 (``--feeders``, as many fronts) keep
``--clients`` requests in flight between them, each through one ``OwnerClient`` (the front's
side): each answer sends the next request, so the messages are the batches fronts send at that
load. Rows are real request lengths
(bench/data/request_lengths.txt) with random token ids.

Both processes' CPU is read from /proc, so the table says which side was the limit: rows/s per
second of the owner's CPU is what one core of queue owner carries.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
import psutil

from bench.cost_tables import LENGTHS, read_lengths, tensorrt_layout
from bench.errors import BenchError, reports_errors
from bench.paths import ROOT

OUTPUT_DIM = 384
PLANNER_OVERHEAD_TOKENS = 128.0  # the planner's fixed cost of a forward, in padded tokens


class ZeroEngine:
    """Forwards that take no time: what is measured is everything around the engine."""

    output_name = "EMBEDDING"
    output_dim = OUTPUT_DIM

    def __init__(self) -> None:
        self.layout = tensorrt_layout()
        self._zeros = np.zeros((self.layout.max_batch, OUTPUT_DIM), np.float32)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self._zeros[: len(input_ids)]

    def close(self) -> None:
        pass


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads (psutil, as
    bench.ceiling_profile reads them)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def serve(endpoint: str) -> None:
    """The owner's process: serves until stdin closes."""
    from python_backend.cost_models import LinearCost
    from python_backend.queue_owner import QueueOwner
    from python_backend.scheduler import Scheduler

    engine = ZeroEngine()
    scheduler = Scheduler(
        engine, 0, LinearCost(PLANNER_OVERHEAD_TOKENS), engine.layout.max_batch, 10**6
    )
    owner = QueueOwner(scheduler, endpoint, OUTPUT_DIM)
    owner.start()
    print("ready", flush=True)
    sys.stdin.read()
    owner.stop(5.0)


def feed(endpoint: str, rows_per_request: int, clients: int, seconds: float, owner_pid: int) -> str:
    """The feeder's process: closed-loop clients; prints 'rows owner_cpu feeder_cpu wall'."""
    from python_backend.owner_client import OwnerClient
    from python_backend.scheduler import Answer

    rng = np.random.default_rng(0)
    lengths = read_lengths(LENGTHS)
    pool = [
        [rng.integers(1, 30000, int(n)) for n in rng.choice(lengths, rows_per_request)]
        for _ in range(256)
    ]
    client = OwnerClient(endpoint, OUTPUT_DIM, log=lambda message: print(message, file=sys.stderr))
    client.start()
    if not client.wait_connected(10):
        raise BenchError("the owner did not accept a connection")
    counted = [0]
    measuring = threading.Event()
    stopping = threading.Event()
    errors: list[str] = []

    sent = [0]

    def respond(outcome) -> None:
        if not isinstance(outcome, Answer):
            if not stopping.is_set():  # the last ones are answered "stopping" by design
                errors.append(str(outcome))
        elif measuring.is_set():
            counted[0] += len(outcome.outputs)
        if not stopping.is_set():
            sent[0] += 1
            client.submit(pool[sent[0] % len(pool)], respond)

    for k in range(clients):
        client.submit(pool[k % len(pool)], respond)
    time.sleep(1.0)  # warm-up
    me = os.getpid()
    owner_start, feeder_start, started = cpu_seconds(owner_pid), cpu_seconds(me), time.monotonic()
    measuring.set()
    time.sleep(seconds)
    measuring.clear()
    wall = time.monotonic() - started
    rows = counted[0]
    owner_cpu, feeder_cpu = cpu_seconds(owner_pid) - owner_start, cpu_seconds(me) - feeder_start
    stopping.set()
    time.sleep(0.2)
    client.stop()
    if errors:
        raise BenchError(f"{len(errors)} requests failed, the first: {errors[0]}")
    return f"{rows} {owner_cpu} {feeder_cpu} {wall}"


def pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and os.cpu_count() else []


def one_round(
    rows_per_request: int, clients: int, seconds: float, feeders: int = 1
) -> tuple[float, float, float]:
    """(rows/s, owner's share of its core, the feeders' share of theirs): ``feeders`` processes
    (as many fronts), ``clients`` requests in flight between them."""
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/owner.sock"
        owner = subprocess.Popen(
            [*pinned(0), sys.executable, "-m", "bench.owner_alone", "--serve", endpoint],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert owner.stdout is not None
            if owner.stdout.readline().strip() != "ready":
                raise BenchError("the owner process did not start")
            feeding = [
                subprocess.Popen(
                    [
                        *pinned(1 if (os.cpu_count() or 1) > 1 else 0),
                        sys.executable,
                        "-m",
                        "bench.owner_alone",
                        "--feed",
                        endpoint,
                        "--owner-pid",
                        str(owner.pid),
                        "--rows-per-request",
                        str(rows_per_request),
                        "--clients",
                        str(max(1, clients // feeders)),
                        "--seconds",
                        str(seconds),
                    ],
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
                for _ in range(feeders)
            ]
            results = []
            for feeder in feeding:
                out, err = feeder.communicate(timeout=seconds + 60)
                if feeder.returncode != 0:
                    raise BenchError(f"a feeder failed: {err[-2000:]}")
                results.append(list(map(float, out.split()[-4:])))
        finally:
            if owner.stdin is not None:
                owner.stdin.close()
            owner.wait(10)
    # the feeders measure the same window, give or take their start: rows add up, the owner's
    # CPU is read by each over its own window (their mean), the feeders' CPU adds up
    wall = float(np.mean([r[3] for r in results]))
    rows = sum(r[0] for r in results)
    owner_cpu = float(np.mean([r[1] for r in results]))
    feeder_cpu = sum(r[2] for r in results)
    return rows / wall, owner_cpu / wall, feeder_cpu / wall


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-request", default="1,64")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--feeders", default="1", help="feeder processes (as many fronts), comma-separated"
    )
    parser.add_argument("--serve", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--feed", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--owner-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve)
        return 0
    if args.feed:
        print(
            feed(args.feed, int(args.rows_per_request), args.clients, args.seconds, args.owner_pid)
        )
        return 0
    sizes = [int(n) for n in args.rows_per_request.split(",")]
    print(
        "| rows per request | feeders | round | rows/s | owner CPU (share of its core) "
        "| feeders' CPU | rows per owner CPU-second |\n|---|---|---|---|---|---|---|"
    )
    for n in sizes:
        for feeders in (int(f) for f in args.feeders.split(",")):
            for r in range(args.rounds):
                rate, owner_share, feeder_share = one_round(n, args.clients, args.seconds, feeders)
                print(
                    f"| {n} | {feeders} | {r + 1} | {rate:.0f} | {owner_share:.0%} "
                    f"| {feeder_share:.0%} | {rate / max(owner_share, 1e-9):.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
