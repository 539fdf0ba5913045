"""Calibration: time the built engine over (batch size, bucket) and fit the planner's cost model.

Measured: the median time of a forward at each bucket length and at batch sizes 1, 2, 4, 8, 16
and the bucket's max rows (each after one warm-up run). Small forwards are where
a lightly loaded server lives and where one timing is least to be trusted on a shared machine, so
each point is timed at least ``repeats`` times and until ``MIN_SECONDS_PER_POINT`` have passed:
a 5 ms forward is timed dozens of times, a 1 s one three times. Fitted:
``time = overhead + B * row_time(T)`` with one shared overhead and one row time per bucket, by
least squares on relative error; the unit is the cheapest measured time per real token, so costs read as tokens.
The fit's worst relative error over the measured points is reported and stored with the table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from python_backend.common.cost_models import BucketAffineCost, MeasuredCost
from python_backend.engines.base import Engine

DENSE_BATCH_SIZES = (1, 2, 4, 8, 16)
MIN_SECONDS_PER_POINT = 0.2  # timed forwards per grid point: at least this long in all
MAX_REPEATS = 60


@dataclass(frozen=True)
class Calibration:
    table: MeasuredCost  # the measured grid, in token-units
    fit: BucketAffineCost  # the affine fit of that grid
    worst_relative_error: float  # of the fit, over the measured points
    seconds: float  # time the calibration took

    def to_dict(self) -> dict[str, object]:
        return {
            "table": self.table.to_dict(),
            "fit": self.fit.to_dict(),
            "worst_relative_error": self.worst_relative_error,
            "seconds": self.seconds,
        }


def batch_grid(max_rows: int) -> list[int]:
    """Batch sizes 1, 2, 4, 8, 16 (those the bucket takes) and its max rows: the table
    interpolates linearly between them, so the grid is dense where a forward's time bends (few
    rows, where a lightly loaded server lives) and sparse where it is a straight line."""
    return sorted({*(b for b in DENSE_BATCH_SIZES if b <= max_rows), max_rows})


def median_seconds(fn: Callable[[], object], repeats: int, min_seconds: float = 0.0) -> float:
    """Median wall time of ``fn`` after one untimed warm-up call, over at least ``repeats`` calls
    and, within ``MAX_REPEATS``, until ``min_seconds`` of timed calls have passed."""
    fn()  # warm-up: allocations, kernel choice, memoised tables
    samples: list[float] = []
    while len(samples) < repeats or (sum(samples) < min_seconds and len(samples) < MAX_REPEATS):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def time_forward(
    engine: Engine, rows: int, length: int, vocab: int, repeats: int, min_seconds: float = 0.0
) -> float:
    """Median microseconds of one forward of ``rows`` full rows at ``length``."""
    rng = np.random.default_rng(rows * 1000 + length)
    ids = rng.integers(1000, max(1001, vocab - 1), size=(rows, length), dtype=np.int64)
    mask = np.ones((rows, length), dtype=np.int64)
    return median_seconds(lambda: engine.run(ids, mask), repeats, min_seconds) * 1e6


def calibrate(
    engine: Engine,
    vocab_size: int,
    repeats: int = 3,
    progress: Callable[[str], None] = lambda _msg: None,
) -> Calibration:
    started = time.perf_counter()
    buckets = engine.layout.buckets
    sizes = sorted({b for bucket in buckets for b in batch_grid(bucket.max_rows)})
    times = np.full((len(buckets), len(sizes)), np.nan)
    for i, bucket in enumerate(buckets):
        for b in batch_grid(bucket.max_rows):
            times[i, sizes.index(b)] = time_forward(
                engine, b, bucket.length, vocab_size, repeats, MIN_SECONDS_PER_POINT
            )
            progress(f"calibrate T={bucket.length} B={b}: {times[i, sizes.index(b)] / 1e3:.1f} ms")

    table, fit, worst = fit_times(tuple(b.length for b in buckets), tuple(sizes), times)
    return Calibration(table, fit, worst, time.perf_counter() - started)


def fit_times(
    lengths: tuple[int, ...], sizes: tuple[int, ...], times: np.ndarray
) -> tuple[MeasuredCost, BucketAffineCost, float]:
    """The measured grid (``times[i, j]``: microseconds at ``lengths[i]`` x ``sizes[j]``, NaN
    where not measured) as a table in token-units, its affine fit, and the fit's worst relative
    error over the measured points."""
    # least squares on relative error: (overhead + b * row_time[i]) / t[i, b] = 1, so small
    # forwards (where the overhead shows) weigh as much as large ones
    rows, rhs = [], []
    for i in range(len(lengths)):
        for j, b in enumerate(sizes):
            if np.isfinite(times[i, j]):
                row = np.zeros(1 + len(lengths))
                row[0], row[1 + i] = 1.0, b
                rows.append(row / times[i, j])
                rhs.append(1.0)
    solution, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    overhead_us = max(0.0, float(solution[0]))
    row_us = np.maximum(solution[1:], 1e-9)
    us_per_token = float(min(row_us[i] / lengths[i] for i in range(len(lengths))))
    fit = BucketAffineCost(
        overhead_tokens=overhead_us / us_per_token,
        lengths=lengths,
        row_costs=tuple(float(r / us_per_token) for r in row_us),
    )
    worst = 0.0
    for i, t in enumerate(lengths):
        for j, b in enumerate(sizes):
            if np.isfinite(times[i, j]):
                predicted = fit.cost(b, t) * us_per_token
                worst = max(worst, abs(predicted - times[i, j]) / times[i, j])
    table = MeasuredCost(
        lengths=lengths,
        batch_sizes=tuple(sizes),
        times_us=tuple(tuple(float(x) for x in r) for r in times),
        us_per_token=us_per_token,
        captured_batch_sizes=(),
    )
    return table, fit, worst
