"""The scheduler step's cost with a free engine, in whatever checkout is on ``PYTHONPATH`` (run as
a file by ``bench.step_overhead``, never imported): prints {rows: median seconds per step}.

    PYTHONPATH=CHECKOUT python bench/step_probe.py '[16, 64, 256]' 200
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import numpy as np

import python_backend.scheduler as s
from python_backend.cost_models import LinearCost
from python_backend.engines.base import BucketLayout
from python_backend.manifest import Bucket


class FreeEngine:
    output_name, output_dim = "EMBEDDING", 8

    def __init__(self, layout: BucketLayout) -> None:
        self.layout = layout

    def run(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return np.zeros((ids.shape[0], 8), np.float32)

    def close(self) -> None:
        pass


def one_step(scheduler: Any, rows: list[np.ndarray], current: bool) -> None:
    """Submit every row as a one-row request, then plan, run and answer them all."""
    for row in rows:
        if current:
            scheduler.submit(s.Request([row], lambda outcome: None))
        else:
            pending = getattr(s, "PendingRequest")  # noqa: B009 (an earlier checkout's API)
            scheduler.submit(pending([row], lambda outputs, tokens, error: None))
    if current:
        scheduler.step()
    else:
        with scheduler._cond:
            taken, scheduler._queue, scheduler._queued_rows = scheduler._queue, [], 0
        scheduler.run_collection(taken)


def step_seconds(sizes: list[int], repeats: int) -> dict[int, float]:
    layout = BucketLayout(tuple(Bucket(t, 64, 16) for t in (16, 32, 64, 128, 256)), 256, 64, None)
    rng = np.random.default_rng(0)
    current = hasattr(s, "Request")  # the step API; earlier checkouts have run_collection
    result = {}
    for n in sizes:
        rows = [rng.integers(1, 30000, int(k)) for k in np.minimum(rng.geometric(1 / 50, n), 256)]
        scheduler = s.Scheduler(FreeEngine(layout), 0, LinearCost(300.0), 64, 10**9)
        one_step(scheduler, rows, current)  # warm
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            one_step(scheduler, rows, current)
            samples.append(time.perf_counter() - started)
        result[n] = float(np.median(samples))
    return result


if __name__ == "__main__":
    print(json.dumps(step_seconds(json.loads(sys.argv[1]), int(sys.argv[2]))))
