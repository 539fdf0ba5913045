from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from python_backend.cost_models import LinearCost
from python_backend.scheduler import PendingRequest, Scheduler, ServeError
from tests.unit.fake_engine import FakeChecksumEngine, expected, layout


class Answers:
    """Collects responses; fails the test on a second answer to one request."""

    def __init__(self) -> None:
        self.by_request: dict[int, tuple] = {}
        self.lock = threading.Lock()

    def responder(self, key: int):
        def respond(outputs, tokens, error):
            with self.lock:
                assert key not in self.by_request, f"request {key} answered twice"
                self.by_request[key] = (outputs, tokens, error)

        return respond


def make_rows(rng, num_rows, max_len=64):
    return [rng.integers(1, 30000, rng.integers(1, max_len + 1)) for _ in range(num_rows)]


def scheduler_for(engine, overhead=64.0, max_queue_rows=10_000, **kw):
    return Scheduler(
        engine,
        pad_token_id=0,
        cost=LinearCost(overhead),
        max_batch=8,
        max_queue_rows=max_queue_rows,
        **kw,
    )


def assert_answer_matches(answer, rows):
    outputs, tokens, error = answer
    assert error is None, error
    assert tokens.tolist() == [len(r) for r in rows]
    for r, row in enumerate(rows):
        assert tuple(outputs[r, :2]) == expected(row), "a row got another row's output"


def test_every_request_is_answered_once_with_its_own_rows():
    rng = np.random.default_rng(0)
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine)
    answers = Answers()
    requests = [make_rows(rng, int(rng.integers(1, 6))) for _ in range(40)]
    pending = [PendingRequest(rows, answers.responder(i)) for i, rows in enumerate(requests)]
    for p in pending:
        scheduler.submit(p)
    scheduler.run_collection(scheduler._queue)
    assert len(answers.by_request) == 40
    for i, rows in enumerate(requests):
        assert_answer_matches(answers.by_request[i], rows)
    # rows were batched: far fewer forwards than rows
    assert len(engine.calls) < sum(len(r) for r in requests) / 3


def test_rows_run_at_the_planned_bucket_never_shorter_than_the_row():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=0)
    answers = Answers()
    rows = [np.arange(1, n + 1) for n in (3, 17, 40, 64, 16)]
    scheduler.run_collection([PendingRequest(rows, answers.responder(0))])
    outputs, _, error = answers.by_request[0]
    assert error is None
    assert outputs[:, 2].tolist() == [16, 32, 64, 64, 16]


def test_a_forward_that_runs_out_of_memory_is_split_with_long_rows_apart():
    # any forward of more than 128 padded tokens "runs out of memory"
    def oom(ids, mask):
        return MemoryError("out of memory") if ids.size > 128 else None

    engine = FakeChecksumEngine(layout(max_rows=8), fail=oom)
    scheduler = scheduler_for(engine, overhead=1000)  # a large overhead merges all 8 rows at 64
    answers = Answers()
    rows = [np.arange(1, 61)] + [np.arange(1, 9) for _ in range(7)]
    scheduler.run_collection([PendingRequest(rows, answers.responder(0))])
    assert_answer_matches(answers.by_request[0], rows)
    assert engine.calls[0] == (8, 64)  # the planned group, which failed
    later = engine.calls[1:]
    assert (1, 64) in later, "the long row is split off on its own"
    assert any(b >= 4 and t == 16 for b, t in later), "the short rows stay together"
    assert len(later) <= 4, "no halving cascade: a few retries, each as large as fits"


def test_a_row_that_fails_even_alone_fails_only_its_own_request():
    poison = 4242

    def poisoned(ids, mask):
        return RuntimeError("engine fault") if (ids == poison).any() else None

    engine = FakeChecksumEngine(layout(), fail=poisoned)
    scheduler = scheduler_for(engine, overhead=10_000)
    answers = Answers()
    rng = np.random.default_rng(1)
    good = [make_rows(rng, 3, max_len=15) for _ in range(5)]
    bad = [np.array([5, poison, 7])]
    pending = [PendingRequest(r, answers.responder(i)) for i, r in enumerate(good)]
    pending.append(PendingRequest(bad, answers.responder(99)))
    scheduler.run_collection(pending)
    for i, rows in enumerate(good):
        assert_answer_matches(answers.by_request[i], rows)
    _, _, error = answers.by_request[99]
    assert isinstance(error, ServeError) and error.kind == "failed"
    assert "row 0 (3 tokens) failed even alone" in str(error) and "engine fault" in str(error)


def test_a_full_queue_refuses_at_once_and_says_so():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, max_queue_rows=5)
    answers = Answers()
    scheduler.submit(PendingRequest([np.arange(1, 4)] * 4, answers.responder(0)))
    scheduler.submit(PendingRequest([np.arange(1, 4)] * 2, answers.responder(1)))
    _, _, error = answers.by_request[1]
    assert error.kind == "queue_full" and "queue full" in str(error) and "limit is 5" in str(error)
    assert 0 not in answers.by_request  # the first is queued, not refused


def test_expired_and_cancelled_requests_are_answered_without_compute():
    now = [100.0]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, clock=lambda: now[0])
    answers = Answers()
    expired = PendingRequest([np.arange(1, 4)], answers.responder(0), deadline=99.0)
    cancelled = PendingRequest([np.arange(1, 4)], answers.responder(1), is_cancelled=lambda: True)
    fine = PendingRequest([np.arange(1, 4)], answers.responder(2), deadline=101.0)
    scheduler.run_collection([expired, cancelled, fine])
    assert answers.by_request[0][2].kind == "timeout"
    assert answers.by_request[1][2].kind == "cancelled"
    assert answers.by_request[2][2] is None
    assert engine.calls == [(1, 16)]


def test_oldest_requests_run_first():
    engine = FakeChecksumEngine(layout(max_rows=1))
    scheduler = scheduler_for(engine, overhead=0)
    order = []
    pending = [
        PendingRequest(
            [np.arange(1, n + 1)],
            lambda o, t, e, key=i: order.append(key),
        )
        for i, n in enumerate((60, 5, 30, 10))
    ]
    for p in pending:
        scheduler.submit(p)
    scheduler.run_collection(scheduler._queue)
    assert order == [0, 1, 2, 3]


def test_requests_arriving_during_a_forward_are_collected_together_next():
    gate = threading.Event()
    engine = FakeChecksumEngine(layout(max_rows=8), gate=gate)
    scheduler = scheduler_for(engine, overhead=64)
    answers = Answers()
    scheduler.start()
    try:
        scheduler.submit(PendingRequest([np.arange(1, 5)], answers.responder(0)))
        time.sleep(0.2)  # the first forward is now waiting at the gate
        for i in range(1, 7):
            scheduler.submit(PendingRequest([np.arange(1, 5)], answers.responder(i)))
        gate.set()
        deadline = time.monotonic() + 5
        while len(answers.by_request) < 7 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        scheduler.stop()
    assert len(answers.by_request) == 7
    assert engine.calls == [(1, 16), (6, 16)]


def test_stop_answers_everything_queued_and_refuses_new_work():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine)
    answers = Answers()
    scheduler.start()
    for i in range(10):
        scheduler.submit(PendingRequest([np.arange(1, 9)], answers.responder(i)))
    scheduler.stop()
    scheduler.submit(PendingRequest([np.arange(1, 9)], answers.responder(10)))
    assert len(answers.by_request) == 11
    assert all(answers.by_request[i][2] is None for i in range(10))
    assert answers.by_request[10][2].kind == "shutdown"


@pytest.mark.parametrize("planner", ["dp", "per_bucket"])
def test_both_planners_serve_the_same_answers(planner):
    rng = np.random.default_rng(3)
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, planner=planner)
    answers = Answers()
    requests = [make_rows(rng, 4) for _ in range(10)]
    scheduler.run_collection(
        [PendingRequest(r, answers.responder(i)) for i, r in enumerate(requests)]
    )
    for i, rows in enumerate(requests):
        assert_answer_matches(answers.by_request[i], rows)


def test_a_slow_response_does_not_hold_up_the_next_forward():
    engine = FakeChecksumEngine(layout(max_rows=1))
    scheduler = scheduler_for(engine, overhead=0)
    release = threading.Event()
    threads, answered = [], []

    def slow(outputs, tokens, error):
        threads.append(threading.current_thread().name)
        release.wait(10)  # the client side of the first response is slow
        answered.append("slow")

    scheduler.start()
    try:
        scheduler.submit(PendingRequest([np.arange(1, 5)], slow))
        scheduler.submit(
            PendingRequest([np.arange(1, 40)], lambda o, t, e: answered.append("next"))
        )
        deadline = time.monotonic() + 5
        while len(engine.calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(engine.calls) == 2, "the second forward ran while the first response was sent"
    finally:
        release.set()
        scheduler.stop()
    assert threads == ["responder"]
    assert answered == ["slow", "next"]  # answers still leave in order, each once


def test_cancellation_is_asked_once_per_request_per_forward_not_per_row():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=64)
    asked = []
    answers = Answers()
    request = PendingRequest(
        [np.arange(1, 9)] * 6, answers.responder(0), is_cancelled=lambda: asked.append(1) or False
    )
    scheduler.run_collection([request])
    assert engine.calls == [(6, 16)]
    assert len(asked) == 2  # once when the collection is taken, once before its one forward
    assert_answer_matches(answers.by_request[0], request.rows)
