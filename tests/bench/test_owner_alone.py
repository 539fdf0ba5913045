"""The owner-alone bench: its waiting engine takes a GPU table's time, and the owner's scheduler
thread's CPU is read apart from the rest of the owner's."""

from __future__ import annotations

import time

import numpy as np
import pytest

from bench.cost_tables import cost_table
from bench.owner_alone import WaitingEngine, one_round


def test_the_waiting_engine_waits_the_tables_time_for_the_size_that_runs():
    engine = WaitingEngine("table:a30")
    table = cost_table("table:a30")
    length = engine.layout.buckets[0].length
    ids = np.ones((3, length), np.int64)
    started = time.perf_counter()
    out = engine.run(ids, ids)
    waited = time.perf_counter() - started
    assert out.shape == (3, engine.output_dim)
    ran = engine.layout.run_batch_size(length, 3)
    assert waited >= table.seconds(ran, length)
    # the zero engine does not wait at all
    started = time.perf_counter()
    WaitingEngine("zero").run(ids, ids)
    assert time.perf_counter() - started < table.seconds(ran, length)


@pytest.mark.parametrize("table", ["zero", "table:a30"])
def test_the_owners_scheduler_thread_is_part_of_its_cpu(table):
    got = one_round(1, 16, 0.3, feeders=1, table=table)
    assert got.rows_per_s > 0
    assert 0 < got.scheduler_share < got.owner_share
