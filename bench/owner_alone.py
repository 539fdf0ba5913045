"""The queue owner alone: no Triton, requests from another process over the owner's socket.

    python -m bench.owner_alone [--rows-per-request 1,64] [--feeders 1,2] [--clients 64]
                                [--seconds 5] [--rounds 3] [--table zero|table:a30]
                                [--overlap off|on|both]

The owner (``python_backend.transport.queue_owner`` over the scheduler, a zero-time engine of a default
TensorRT build's layout, 384 outputs a row; with ``--table``, forwards that wait a GPU table's
time, as the owner's GPU forwards would, releasing the GIL) runs in its own process pinned to core 0 with
``taskset``. Feeder processes pinned to core 1 (``--feeders``, as many fronts) keep
``--clients`` requests in flight between them, each through one ``RemoteOwner`` (the front's
side): each answer sends the next request, so the messages are the batches fronts send at that
load. Rows are real request lengths
(bench/data/request_lengths.txt) with random token ids.

Both processes' CPU is read from /proc, so the table says which side was the limit: rows/s per
second of the owner's CPU is what one core of queue owner carries. The owner's scheduler
thread's CPU is read apart: it alone runs between one forward and the next; the owner's socket
thread (and ZeroMQ's own) can run while a forward waits.
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
from dataclasses import dataclass

import numpy as np
import psutil

from bench.cost_tables import LENGTHS, cost_table, read_lengths, tensorrt_layout
from bench.errors import BenchError, reports_errors
from bench.paths import ROOT

OUTPUT_DIM = 384
VOCAB_SIZE = 30522  # the owner's forwards check ids against the vocabulary, as served
PLANNER_OVERHEAD_TOKENS = 128.0  # the planner's fixed cost of a forward, in padded tokens
# --overlap: the owner's forwards on an engine thread (Scheduler overlap), or not, or both
OVERLAP = {"off": (False,), "on": (True,), "both": (False, True)}


class WaitingEngine:
    """Forwards that wait a cost table's time for the size that runs (none: ``zero``, where
    what is measured is everything around the engine) and answer zeros. Waiting releases the
    GIL, as a GPU's forward does while the owner's other threads run."""

    output_name = "EMBEDDING"
    output_dim = OUTPUT_DIM

    def __init__(self, table: str = "zero") -> None:
        self.table = None if table == "zero" else cost_table(table)
        self.layout = tensorrt_layout() if self.table is None else self.table.layout
        self._zeros = np.zeros((self.layout.max_batch, OUTPUT_DIM), np.float32)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        rows, length = input_ids.shape
        if self.table is not None:
            time.sleep(self.table.seconds(self.layout.run_batch_size(length, rows), length))
        return self._zeros[:rows]

    def close(self) -> None:
        pass


def cpu_seconds(pid: int) -> float:
    """User plus system CPU seconds of a process, all its threads (psutil)."""
    times = psutil.Process(pid).cpu_times()
    return times.user + times.system


def thread_cpu_seconds(pid: int, thread_id: int) -> float:
    """User plus system CPU seconds of one thread of a process (psutil, as ``cpu_seconds``)."""
    times = next(t for t in psutil.Process(pid).threads() if t.id == thread_id)
    return times.user_time + times.system_time


def serve(endpoint: str, table: str, overlap: bool = False) -> None:
    """The owner's process: serves until stdin closes. Prints 'ready TID', the scheduler
    thread's id (its CPU is what runs in series with the forwards)."""
    from python_backend.common.cost_models import LinearCost
    from python_backend.scheduling.owners import LocalOwner
    from python_backend.scheduling.scheduler import Scheduler
    from python_backend.transport.queue_owner import QueueOwner

    engine = WaitingEngine(table)
    # the planner's fixed cost: the table's own, as calibration would find it (the simulator's)
    overhead = PLANNER_OVERHEAD_TOKENS if engine.table is None else engine.table.fixed_tokens
    scheduler = Scheduler(
        engine,
        0,
        LinearCost(overhead),
        engine.layout.max_batch,
        10**6,
        overlap=overlap,
        vocab_size=VOCAB_SIZE,
    )
    owner = QueueOwner(LocalOwner(scheduler, engine, responder=False), endpoint, OUTPUT_DIM)
    owner.start()
    print(f"ready {scheduler.thread_id}", flush=True)
    sys.stdin.read()
    owner.stop(5.0)


def feed(
    endpoint: str,
    rows_per_request: int,
    clients: int,
    seconds: float,
    owner_pid: int,
    scheduler_thread: int,
) -> str:
    """The feeder's process: closed-loop clients; prints 'rows owner_cpu feeder_cpu wall
    scheduler_cpu' (the owner's scheduler thread's CPU, part of owner_cpu)."""
    from python_backend.scheduling.records import Answer, Request
    from python_backend.transport.remote_owner import RemoteOwner

    rng = np.random.default_rng(0)
    lengths = read_lengths(LENGTHS)
    pool = [
        [rng.integers(1, 30000, int(n)) for n in rng.choice(lengths, rows_per_request)]
        for _ in range(256)
    ]
    client = RemoteOwner(
        endpoint, OUTPUT_DIM, log=lambda message: print(message, file=sys.stderr), wait_s=10
    )
    try:
        client.start()
    except RuntimeError as err:
        raise BenchError(str(err)) from None
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
            client.submit(Request(pool[sent[0] % len(pool)], respond))

    for k in range(clients):
        client.submit(Request(pool[k % len(pool)], respond))
    time.sleep(1.0)  # warm-up
    me = os.getpid()
    scheduler_start = thread_cpu_seconds(owner_pid, scheduler_thread)
    owner_start, feeder_start, started = cpu_seconds(owner_pid), cpu_seconds(me), time.monotonic()
    measuring.set()
    time.sleep(seconds)
    measuring.clear()
    wall = time.monotonic() - started
    rows = counted[0]
    owner_cpu, feeder_cpu = cpu_seconds(owner_pid) - owner_start, cpu_seconds(me) - feeder_start
    scheduler_cpu = thread_cpu_seconds(owner_pid, scheduler_thread) - scheduler_start
    stopping.set()
    time.sleep(0.2)
    client.stop()
    if errors:
        raise BenchError(f"{len(errors)} requests failed, the first: {errors[0]}")
    return f"{rows} {owner_cpu} {feeder_cpu} {wall} {scheduler_cpu}"


def pinned(core: int) -> list[str]:
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and os.cpu_count() else []


@dataclass(frozen=True)
class OwnerRound:
    """One round: rows/s, and shares of a core: the owner's (all its threads), its scheduler
    thread's (part of it: what runs between forwards), the feeders'."""

    rows_per_s: float
    owner_share: float
    scheduler_share: float
    feeder_share: float


def one_round(
    rows_per_request: int,
    clients: int,
    seconds: float,
    feeders: int = 1,
    table: str = "zero",
    overlap: bool = False,
) -> OwnerRound:
    """``feeders`` processes (as many fronts), ``clients`` requests in flight between them, the
    owner's forwards waiting ``table``'s time (on an engine thread with ``overlap``)."""
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = f"ipc://{tmp}/owner.sock"
        me = [sys.executable, "-m", "bench.owner_alone"]
        serve = ["--serve", endpoint, "--table", table, "--overlap", "on" if overlap else "off"]
        owner = subprocess.Popen(
            [*pinned(0), *me, *serve],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert owner.stdout is not None
            ready = owner.stdout.readline().split()
            if not ready or ready[0] != "ready":
                raise BenchError("the owner process did not start")
            feed = ["--feed", endpoint, "--owner-pid", str(owner.pid)]
            feed += ["--scheduler-thread", ready[1], "--rows-per-request", str(rows_per_request)]
            feed += ["--clients", str(max(1, clients // feeders)), "--seconds", str(seconds)]
            feeding = [
                subprocess.Popen(
                    [*pinned(1 if (os.cpu_count() or 1) > 1 else 0), *me, *feed],
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
                results.append(list(map(float, out.split()[-5:])))
        finally:
            if owner.stdin is not None:
                owner.stdin.close()
            owner.wait(10)
    # the feeders measure the same window, give or take their start: rows add up, the owner's
    # CPU is read by each over its own window (their mean), the feeders' CPU adds up
    wall = float(np.mean([r[3] for r in results]))
    return OwnerRound(
        rows_per_s=sum(r[0] for r in results) / wall,
        owner_share=float(np.mean([r[1] for r in results])) / wall,
        scheduler_share=float(np.mean([r[4] for r in results])) / wall,
        feeder_share=sum(r[2] for r in results) / wall,
    )


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
    parser.add_argument(
        "--table",
        default="zero",
        help="the owner's forwards wait this table's time (table:a30, table:a100), or none (zero)",
    )
    parser.add_argument(
        "--overlap",
        default="off",
        choices=tuple(OVERLAP),
        help="the owner's forwards on an engine thread (overlap_forwards); both: alternating",
    )
    parser.add_argument("--serve", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--scheduler-thread", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--feed", metavar="ENDPOINT", help=argparse.SUPPRESS)
    parser.add_argument("--owner-pid", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.table, args.overlap == "on")
        return 0
    if args.feed:
        print(
            feed(
                args.feed,
                int(args.rows_per_request),
                args.clients,
                args.seconds,
                args.owner_pid,
                args.scheduler_thread,
            )
        )
        return 0
    from bench.harness import alternating  # not in the owner's and feeders' processes

    sizes = [int(n) for n in args.rows_per_request.split(",")]
    print(
        "| rows per request | feeders | overlap | round | rows/s | owner CPU (share of its core) "
        "| its scheduler thread | feeders' CPU | rows per owner CPU-second |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    for n in sizes:
        for feeders in (int(f) for f in args.feeders.split(",")):
            for r, overlap in alternating(OVERLAP[args.overlap], args.rounds):
                got = one_round(n, args.clients, args.seconds, feeders, args.table, overlap)
                print(
                    f"| {n} | {feeders} | {'on' if overlap else 'off'} | {r + 1} "
                    f"| {got.rows_per_s:.0f} | {got.owner_share:.0%} "
                    f"| {got.scheduler_share:.0%} | {got.feeder_share:.0%} "
                    f"| {got.rows_per_s / max(got.owner_share, 1e-9):.0f} |",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
