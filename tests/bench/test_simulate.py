"""The simulator drives the real scheduler on a virtual clock: its figures must obey the laws a
queue obeys, and its cost tables must reproduce the measurements they came from."""

from __future__ import annotations

import numpy as np
import pytest

from bench.cost_tables import (
    PUBLISHED_BERT_BASE_FP16_MS,
    CostTable,
    fit_gpu_rule,
    gpu_table,
)
from bench.cost_tables import (
    linear_table as synthetic,
)
from bench.sim.policies import POLICIES
from bench.sim.run import simulate as simulate_run


def simulate(*args, warmup_s: float = 1.0, **kwargs):
    """A run with a warm-up of 1 s (5 s by default): milliseconds-long forwards reach their
    steady state in far less, and the suite stays quick."""
    return simulate_run(*args, warmup_s=warmup_s, **kwargs)


LENGTHS = [5, 9, 13, 20, 31, 45, 60, 90, 128, 200, 256] * 10


def linear_table(fixed_ms: float, us_per_token: float) -> CostTable:
    return synthetic(fixed_ms / 1e3, us_per_token / 1e6, "test")


@pytest.mark.parametrize("gpu", sorted(PUBLISHED_BERT_BASE_FP16_MS))
def test_the_gpu_rule_reproduces_the_published_points(gpu):
    rule, worst = fit_gpu_rule(PUBLISHED_BERT_BASE_FP16_MS[gpu])
    assert worst < 0.25
    assert rule.fixed_ms > 0.2, "a forward's fixed cost on a GPU is a fraction of a millisecond"
    for length, by_batch in PUBLISHED_BERT_BASE_FP16_MS[gpu].items():
        assert rule.ms(128, length) == pytest.approx(by_batch[128], rel=0.25)


def test_the_gpu_table_is_worth_hundreds_of_tokens_per_forward():
    assert 100 < gpu_table("a30").fixed_tokens < 2000


@pytest.mark.parametrize("policy", POLICIES)
def test_a_closed_loop_obeys_littles_law(policy):
    r = simulate(LENGTHS, linear_table(1.0, 0.5), policy, concurrency=16, seconds=2)
    mean_latency_s = float(np.mean(r.latencies_s))
    assert r.rows_per_s * mean_latency_s == pytest.approx(16, rel=0.05)
    assert 0 < r.summary()["padding_efficiency"] <= 1


def test_an_open_loop_under_capacity_serves_what_it_is_offered():
    r = simulate(LENGTHS, linear_table(0.5, 0.2), "dp", rate=200, seconds=6)
    assert r.rows_per_s == pytest.approx(200, rel=0.1)


@pytest.mark.parametrize("seconds", [0.3, 0.6])
def test_an_open_loop_over_capacity_is_served_at_capacity_not_more(seconds):
    # 100 us a row, whatever the grouping: 10,000 rows/s at most. Offered 10x that, each step
    # takes the whole queue and its forwards run far past the window's end: what they answer
    # there is not the window's
    free = linear_table(0.0, 0.0)
    r = simulate(
        LENGTHS, free, "dp", rate=100_000, seconds=seconds, warmup_s=0.1, server_us_per_row=100
    )
    assert r.rows_per_s == pytest.approx(10_000, rel=0.03)
    assert r.served_over_offered == pytest.approx(0.1, rel=0.1)


def test_an_open_loop_under_capacity_answers_what_arrives_in_its_window():
    r = simulate(
        LENGTHS, linear_table(0.0, 0.0), "dp", rate=2500, seconds=1.0, warmup_s=0.2,
        server_us_per_row=100,
    )  # fmt: skip
    # the arrivals' own noise cancels: answered against arrived, not against the rate
    assert r.served_over_offered == pytest.approx(1.0, abs=0.005)


def test_the_dp_beats_per_bucket_grouping_when_a_forward_costs_much_fixed_time():
    heavy = linear_table(fixed_ms=5.0, us_per_token=0.5)  # 10000 tokens of fixed cost
    dp = simulate(LENGTHS, heavy, "dp", concurrency=32, seconds=2)
    per_bucket = simulate(LENGTHS, heavy, "per_bucket", concurrency=32, seconds=2)
    assert dp.rows_per_s > 1.2 * per_bucket.rows_per_s


def test_the_server_time_per_row_caps_throughput():
    free = linear_table(0.0, 0.0)
    r = simulate(
        LENGTHS, free, "dp", concurrency=64, seconds=1, warmup_s=0.2, server_us_per_row=100
    )
    assert r.rows_per_s == pytest.approx(10_000, rel=0.02)


def test_requests_of_several_rows_obey_littles_law_in_rows():
    r = simulate(
        LENGTHS, linear_table(1.0, 0.5), "dp", concurrency=8, seconds=2, rows_per_request=4
    )
    mean_latency_s = float(np.mean(r.latencies_s))
    # 8 requests in flight, 4 rows each: rows/s x latency = rows in flight
    assert r.rows_per_s * mean_latency_s == pytest.approx(32, rel=0.05)


def test_an_open_loop_counts_its_rate_in_rows_whatever_the_request_size():
    r = simulate(LENGTHS, linear_table(0.5, 0.2), "dp", rate=200, seconds=12, rows_per_request=5)
    assert r.rows_per_s == pytest.approx(200, rel=0.1)


def test_the_served_forwards_are_compared_with_the_table_bucket_by_bucket():
    from bench.sim.validation import served_over_calibrated

    table = linear_table(1.0, 10.0)  # 1 ms + 10 us per padded token
    before = {32: {"forwards": 2.0, "rows": 8.0, "seconds": 1.0}}
    # since then: 10 forwards of 4 rows at 32 (each 1 + 1.28 ms) and 5 of 2 rows at 64 (each
    # 1 + 1.28 ms), all twice as slow as the table
    after = {
        32: {"forwards": 12.0, "rows": 48.0, "seconds": 1.0 + 10 * 2 * 2.28e-3},
        64: {"forwards": 5.0, "rows": 10.0, "seconds": 5 * 2 * 2.28e-3},
    }
    assert served_over_calibrated(before, after, table) == pytest.approx(2.0)


def test_a_table_plans_with_its_own_layout_and_charges_the_size_that_runs():
    from python_backend.common.manifest import Bucket
    from python_backend.engines.base import BucketLayout

    # a served ONNX Runtime model's caps: few rows at the long bucket
    caps = BucketLayout((Bucket(16, 64, 32), Bucket(256, 4, 2)), 256, 64, None)
    table = synthetic(1e-3, 1e-6, "capped", layout=caps)
    r = simulate(LENGTHS, table, "dp", concurrency=64, seconds=2)  # over a cap would raise
    assert r.rows_per_s > 0
    # TensorRT's layout pads a forward to its next captured size, and is charged for it
    from bench.cost_tables import tensorrt_layout
    from bench.sim.run import TimedEngine, VirtualClock

    layout = tensorrt_layout()
    bucket = layout.buckets[0]
    assert bucket.captured_batch_sizes and 3 not in bucket.captured_batch_sizes
    clock = VirtualClock()
    engine = TimedEngine(layout, synthetic(0.0, 1.0, "per token", layout), clock, 0.0)
    engine.run(np.ones((3, bucket.length), np.int64), np.ones((3, bucket.length), np.int64))
    assert clock.now == pytest.approx(layout.run_batch_size(bucket.length, 3) * bucket.length)


@pytest.mark.parametrize(
    "policy, overlap", [("dp", False), ("dp", True), ("dynamic_batcher", True)]
)
def test_a_load_beside_another_is_answered_and_classes_serve_the_first_ahead(policy, overlap):
    """Interactive clients beside bulk connections: each load obeys Little's law on its own,
    and with the bulk in class 2 the interactive rows wait less than in one class. Overlapped,
    a policy that waits (the dynamic batcher's delay) may find its time passed once the forward
    in flight has run, and plans then."""
    from bench.sim.run import Load
    from python_backend.scheduling.policy import ServiceClasses

    table = linear_table(1.0, 0.5)
    runs = {
        bulk_class: simulate(
            LENGTHS,
            table,
            policy,
            concurrency=2,
            seconds=2,
            beside=Load(8, 16, bulk_class, "bulk"),
            classes=ServiceClasses(),
            overlap=overlap,
        )
        for bulk_class in (1, 2)
    }
    for r in runs.values():
        assert r.beside is not None and r.beside.latencies_s
        for load, clients in ((r, 2), (r.beside, 8)):
            requests_s = len(load.latencies_s) / load.seconds
            assert requests_s * float(np.mean(load.latencies_s)) == pytest.approx(clients, rel=0.1)
    if policy == "dp":  # (overlapped, the forward in flight is waited out: within the bound)
        assert runs[2].percentile_ms(99) < runs[1].percentile_ms(99) / (1.25 if overlap else 2)


def test_with_overlap_a_step_is_planned_while_the_forward_before_runs():
    """The simulator's overlap, as a GPU deployment serves: a step returns with its forward in
    flight; the next one, waiting for it, moves the clock to the next arrival, not past it, so
    an interactive request coming mid-forward ends the bulk step there, and its forward starts
    as the bulk one ends. The bulk request is answered once, after."""
    import math

    from bench.sim.run import OverlappedTimedRunner, TimedEngine, VirtualClock
    from python_backend.common.cost_models import LinearCost
    from python_backend.scheduling.policy import ServiceClasses
    from python_backend.scheduling.records import Request
    from python_backend.scheduling.scheduler import Scheduler

    table = linear_table(1.0, 1.0)  # 1 ms a forward, 1 us a padded token
    clock = VirtualClock()
    arrivals: list[tuple[float, Request]] = []
    answered: dict[str, list[float]] = {}

    def arrive() -> None:
        while arrivals and arrivals[0][0] <= clock.now:
            t, request = arrivals.pop(0)
            now, clock.now = clock.now, t
            scheduler.submit(request)
            clock.now = now

    def request(name: str, lengths: list[int], priority: int) -> Request:
        rows = [np.ones(n, np.int64) for n in lengths]
        return Request(
            rows,
            lambda _: answered.setdefault(name, []).append(clock.now),
            client=name,
            priority=priority,
        )

    engine = TimedEngine(table.layout, table, clock, 0.0, arrive)
    runner = OverlappedTimedRunner(engine, lambda: arrivals[0][0] if arrivals else math.inf)
    scheduler = Scheduler(
        engine,
        0,
        LinearCost(table.fixed_tokens),
        table.layout.max_batch,
        10**9,
        classes=ServiceClasses(wait_s=1.0),
        clock=clock,
        timer=clock,
        runner=runner,
    )
    # two bulk forwards (8 rows at 256, then 8 at 16); a query comes 1 ms into the first
    scheduler.submit(request("bulk", [200] * 8 + [10] * 8, priority=2))
    arrivals.append((1e-3, request("query", [10], priority=1)))
    first = table.seconds(8, 256)
    scheduler.step(clock.now, finish_last=False)
    assert runner.in_flight is not None and len(runner.in_flight.rows) == 8
    assert clock.now == pytest.approx(1e-3), "the clock stopped at the query's arrival"
    scheduler.step(clock.now, finish_last=False)
    scheduler.settle()
    ran = engine.forwards
    assert ran[0][3] == pytest.approx(first) and ran[1][3] - ran[1][4] == pytest.approx(first)
    assert answered["query"] == [pytest.approx(ran[1][3])], (
        "its forward started as the bulk's ended"
    )
    while scheduler.queued_rows:
        scheduler.step(clock.now, finish_last=False)
        scheduler.settle()
    assert len(answered["bulk"]) == 1 and answered["bulk"][0] > answered["query"][0]
    starts = [end - took for *_, end, took in ran]
    assert all(b >= a for a, b in zip([end for *_, end, _ in ran], starts[1:], strict=False))
