"""The scheduler with its forwards on an engine thread (``overlap``): every test of the
synchronous scheduler again, and what only the overlap can break."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from python_backend.common.contract import ErrorKind
from python_backend.scheduling.records import Answer, Request
from python_backend.scheduling.scheduler import Scheduler
from testkit.fake_engine import FakeChecksumEngine, layout
from tests.unit.test_scheduler import *  # noqa: F403 (every test, collected again here)
from tests.unit.test_scheduler import Answers, run_now, scheduler_for


@pytest.fixture(autouse=True)
def overlapped(monkeypatch):
    """Every scheduler these tests make runs its forwards on an engine thread."""
    made = Scheduler.__init__

    def with_overlap(self, *args, **kwargs):
        kwargs.setdefault("overlap", True)
        made(self, *args, **kwargs)

    monkeypatch.setattr(Scheduler, "__init__", with_overlap)


def test_a_forward_runs_while_the_one_before_it_is_answered():
    # each request's answer waits until the next forward has started: only an engine on a thread
    # of its own, running while the scheduler thread answers, has started it by then
    engine = FakeChecksumEngine(layout(max_rows=1))
    scheduler = scheduler_for(engine, overhead=0)
    next_started = {}

    def respond_for(k):
        def respond(outcome):
            assert isinstance(outcome, Answer)
            next_started[k] = k == 3 or engine.wait_for_calls(k + 2, timeout_s=2)

        return respond

    # one row each, all of one bucket: one step of 4 forwards, oldest first
    run_now(scheduler, [Request([np.arange(1, 5)], respond_for(k)) for k in range(4)])
    assert next_started == {0: True, 1: True, 2: True, 3: True}


def test_a_row_cancelled_while_the_forward_before_it_runs_never_reaches_the_engine():
    cancelled = threading.Event()
    engine = FakeChecksumEngine(layout(max_rows=1))
    checked = engine.run

    def run(input_ids, attention_mask):
        cancelled.set()  # while the first forward runs, the second request is cancelled
        return checked(input_ids, attention_mask)

    engine.run = run  # type: ignore[method-assign]
    scheduler = scheduler_for(engine, overhead=0)
    answers = Answers()
    first = Request([np.arange(1, 20)], answers.responder(0))
    second = Request([np.arange(1, 5)], answers.responder(1), is_cancelled=cancelled.is_set)
    run_now(scheduler, [first, second])
    assert answers.by_request[0][2] is None
    assert answers.by_request[1][2].kind is ErrorKind.CANCELLED
    assert engine.calls == [(1, 32)], "the cancelled row ran"


def test_the_forwards_run_on_the_engine_thread_and_it_ends_with_the_scheduler():
    threads = set()
    engine = FakeChecksumEngine(layout())
    checked = engine.run

    def run(input_ids, attention_mask):
        threads.add(threading.current_thread().name)
        return checked(input_ids, attention_mask)

    engine.run = run  # type: ignore[method-assign]
    scheduler = scheduler_for(engine)
    answers = Answers()
    scheduler.start()
    for k in range(5):
        scheduler.submit(Request([np.arange(1, 5 + k)], answers.responder(k)))
    assert answers.wait_for(5)
    assert scheduler.stop()
    assert threads == {"engine"}
    engine_thread = scheduler.runner._thread
    assert engine_thread is not None
    engine_thread.join(2)
    assert not engine_thread.is_alive(), "the engine thread outlived the scheduler"
