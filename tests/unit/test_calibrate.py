"""Calibration's grid and its timing: dense where a forward's time bends (few rows), and short
forwards timed long enough to be trusted."""

from __future__ import annotations

import time

import pytest

from builder.calibrate import MAX_REPEATS, batch_grid, median_seconds


@pytest.mark.parametrize(
    ("max_rows", "grid"),
    [
        (1, [1]),
        (4, [1, 2, 4]),
        (16, [1, 2, 4, 8, 16]),
        (24, [1, 2, 4, 8, 16, 24]),
        (64, [1, 2, 4, 8, 16, 64]),
    ],
)
def test_the_grid_is_dense_at_few_rows_and_ends_at_the_max_rows(max_rows, grid):
    assert batch_grid(max_rows) == grid


def counting(seconds: float):
    calls = []

    def fn() -> None:
        calls.append(1)
        time.sleep(seconds)

    return fn, calls


def test_a_short_forward_is_timed_until_the_time_budget_is_spent():
    durations: list[float] = []

    def fn() -> None:
        start = time.perf_counter()
        time.sleep(0.002)
        durations.append(time.perf_counter() - start)

    median_seconds(fn, repeats=3, min_seconds=0.03)
    timed = durations[1:]  # after the warm-up; a loaded machine sleeps longer, never shorter
    assert len(timed) > 3, "the time budget, not the repeats, decided how often it ran"
    assert sum(timed) >= 0.03 * 0.9  # the loop's own clock reads a little more than fn's
    assert sum(timed[:-1]) < 0.03 * 1.1, "it stopped once the budget was spent"


def test_a_long_forward_is_timed_the_given_number_of_times():
    fn, calls = counting(0.02)
    median = median_seconds(fn, repeats=3, min_seconds=0.01)
    assert len(calls) == 4 and median >= 0.02


def test_the_repeats_are_bounded_however_short_the_forward():
    fn, calls = counting(0.0)
    median_seconds(fn, repeats=1, min_seconds=60.0)
    assert len(calls) == 1 + MAX_REPEATS
