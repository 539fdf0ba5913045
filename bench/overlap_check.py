"""``overlap_forwards`` on a real engine: the project's scheduler over the torch engine (on a GPU
where there is one), its forwards in line with the scheduler thread or on an engine thread, in
alternating rounds.

    python -m bench.overlap_check [--device auto|cuda|cpu] [--clients 256] [--rows-per-request 1]
                                  [--seconds 5] [--rounds 3]

It runs where the torch engine's device check runs (``builder.torch_check``: torch, numpy and
transformers, the lent GPU machine; no Triton, no ZeroMQ): the engine's files are written as
the builder writes them (MiniLM's shape from a config on a GPU, the builder tests' tiny BERT on
the CPU), its forward times are measured at every bucket and captured size and fitted as the
builder fits them, and the scheduler plans with that fit. A closed loop of ``--clients``
requests of the bench corpus's lengths (random token ids) is kept in flight: each answer, taken
by a feeder thread as a front's I/O thread takes them, sends the next request. The queue owner's
socket and the fronts are left out: what is measured is what the GPU serves behind one
scheduler, and the scheduler thread's CPU, with the overlap and without it (without it, that
thread runs the forwards too: their CPU, and on a GPU their launches and the wait for them, are
in its figure). The simulator's CPU
model puts that thread's CPU in series with the forwards (docs/ARCHITECTURE.md, "What of the
owner runs in series with the forwards"); on a GPU this measures it.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from builder.calibrate import fit_times
from builder.torch_check import CORPUS_LENGTHS, SEED, target_on, time_grid, write_engine
from python_backend.common.cost_models import CostModel
from python_backend.common.manifest import Manifest
from python_backend.engines.torch_engine import TorchEngine
from python_backend.scheduling.records import Answer, Outcome, Request
from python_backend.scheduling.scheduler import Scheduler, SchedulerMetrics

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


class ForwardCount(SchedulerMetrics):
    """The scheduler's metrics: the forwards it ran, nothing else."""

    def __init__(self) -> None:
        self.forwards = 0

    def forward(self, padded_length: int, rows: int, real_tokens: int, seconds: float) -> None:
        self.forwards += 1


def thread_cpu_s(native_id: int) -> float:
    """CPU seconds one thread of this process has used (/proc: user and system)."""
    with open(f"/proc/self/task/{native_id}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass(frozen=True)
class Round:
    overlap: bool
    rows_per_s: float
    rows_per_forward: float
    scheduler_us_per_row: float  # the scheduler thread's CPU
    errors: list[str]  # each request answered with an error: its message


class ClosedLoop:
    """``clients`` requests in flight through ``scheduler``: each answer sends the next one."""

    def __init__(
        self, scheduler: Scheduler, rows: list[np.ndarray], clients: int, rows_per_request: int
    ) -> None:
        self.scheduler = scheduler
        self.rows = rows
        self.rows_per_request = rows_per_request
        self.rng = np.random.default_rng(SEED)
        self.answers: queue.SimpleQueue[Outcome | None] = queue.SimpleQueue()
        self.answered_rows = 0
        self.errors: list[str] = []
        # the feeder sends under this lock, and ``stop`` marks the loop stopping under it: no
        # request is sent to a scheduler that is stopping (it would be refused, rightly)
        self._sending = threading.Lock()
        self.stopping = False
        self.feeder = threading.Thread(target=self._feed, name="feeder", daemon=True)
        for _ in range(clients):
            self._send()
        self.feeder.start()

    def _send(self) -> None:
        picks = self.rng.integers(0, len(self.rows), self.rows_per_request)
        self.scheduler.submit(Request([self.rows[k] for k in picks], self.answers.put))

    def _feed(self) -> None:
        while (outcome := self.answers.get()) is not None:
            if isinstance(outcome, Answer):
                self.answered_rows += len(outcome.outputs)
            else:
                self.errors.append(str(outcome))
            with self._sending:
                if not self.stopping:
                    self._send()

    def stop(self) -> None:
        with self._sending:
            self.stopping = True
        self.scheduler.stop()
        self.answers.put(None)
        self.feeder.join()


def one_round(
    engine: TorchEngine,
    manifest: Manifest,
    cost: CostModel,
    rows: list[np.ndarray],
    overlap: bool,
    clients: int,
    rows_per_request: int,
    seconds: float,
) -> Round:
    counted = ForwardCount()
    scheduler = Scheduler(
        engine,
        manifest.pad_token_id,
        cost,
        manifest.max_batch,
        max_queue_rows=clients * rows_per_request,
        metrics=counted,
        overlap=overlap,
    )
    scheduler.start(responder=False)  # the answer is a queue put, as the owner's is
    loop = ClosedLoop(scheduler, rows, clients, rows_per_request)
    time.sleep(min(1.0, seconds / 4))  # warm-up
    assert scheduler.thread_id is not None
    rows_before, cpu_before = loop.answered_rows, thread_cpu_s(scheduler.thread_id)
    forwards_before = counted.forwards
    started = time.perf_counter()
    time.sleep(seconds)
    wall = time.perf_counter() - started
    answered = loop.answered_rows - rows_before
    cpu = thread_cpu_s(scheduler.thread_id) - cpu_before
    forwards = counted.forwards - forwards_before
    loop.stop()
    return Round(
        overlap,
        answered / wall,
        answered / max(1, forwards),
        cpu / max(1, answered) * 1e6,
        loop.errors,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    parser.add_argument("--clients", type=int, default=256)
    parser.add_argument("--rows-per-request", type=int, default=1)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    target = target_on(args.device)
    if target is None:
        return 2
    with tempfile.TemporaryDirectory(prefix="overlap-check-") as folder:
        manifest = write_engine(target, Path(folder))
        engine = TorchEngine(manifest, Path(folder))
        try:
            sizes, times = time_grid(engine, manifest)
            _, cost, _ = fit_times(tuple(b.length for b in manifest.buckets), sizes, times)
            longest = manifest.buckets[-1].length
            lengths = [min(int(x), longest) for x in CORPUS_LENGTHS.read_text().split()]
            rng = np.random.default_rng(SEED)
            rows = [rng.integers(1000, manifest.vocab_size, n, dtype=np.int64) for n in lengths]
            print(
                f"torch {torch.__version__} on {target.device_name}: {target.model} "
                f"{target.precision}, {args.clients} clients of {args.rows_per_request} row(s), "
                f"the planner's fitted overhead {cost.overhead_tokens:.0f} tokens"
            )
            results: dict[bool, list[Round]] = {False: [], True: []}
            for r in range(args.rounds):
                order = (False, True) if r % 2 == 0 else (True, False)
                for overlap in order:
                    got = one_round(
                        engine,
                        manifest,
                        cost,
                        rows,
                        overlap,
                        args.clients,
                        args.rows_per_request,
                        args.seconds,
                    )
                    results[overlap].append(got)
                    print(
                        f"round {r + 1}, overlap {'on ' if overlap else 'off'}: "
                        f"{got.rows_per_s:9.0f} rows/s, {got.rows_per_forward:5.1f} rows a "
                        f"forward, scheduler thread {got.scheduler_us_per_row:6.1f} us a row, "
                        f"{len(got.errors)} errors",
                        flush=True,
                    )
        finally:
            engine.close()
    means = {k: float(np.mean([g.rows_per_s for g in v])) for k, v in results.items()}
    print(
        f"\noverlap on / off: {means[True] / means[False]:.2f}x rows/s "
        f"({means[True]:.0f} against {means[False]:.0f}, means of {args.rounds} rounds)"
    )
    errors = [e for v in results.values() for g in v for e in g.errors]
    if errors:
        print(f"FAIL: {len(errors)} request(s) answered with an error, the first: {errors[0]}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
