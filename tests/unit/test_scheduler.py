from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from python_backend.common.contract import ErrorKind, Reason, ServeError
from python_backend.common.cost_models import LinearCost
from python_backend.scheduling.planner import PLANNERS
from python_backend.scheduling.policy import Policy, PolicyPlan
from python_backend.scheduling.records import Answer, Request
from python_backend.scheduling.scheduler import Scheduler, SchedulerMetrics
from testkit.fake_engine import FakeChecksumEngine, expected, layout


class Answers:
    """Collects responses; fails the test on a second answer to one request."""

    def __init__(self) -> None:
        self.by_request: dict[int, tuple] = {}
        self.lock = threading.Condition()

    def wait_for(self, count: int, timeout_s: float = 5.0) -> bool:
        with self.lock:
            return self.lock.wait_for(lambda: len(self.by_request) >= count, timeout_s)

    def responder(self, key: int):
        def respond(outcome):
            with self.lock:
                assert key not in self.by_request, f"request {key} answered twice"
                self.by_request[key] = as_triple(outcome)
                self.lock.notify_all()

        return respond


def as_triple(outcome) -> tuple:
    """(outputs, tokens, error) of an outcome."""
    if isinstance(outcome, Answer):
        return outcome.outputs, outcome.num_tokens, None
    assert isinstance(outcome, ServeError)
    return None, None, outcome


def run_now(scheduler, requests) -> None:
    """Queues the requests and runs one step on this thread."""
    for request in requests:
        scheduler.submit(request)
    scheduler.step()


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
    pending = [Request(rows, answers.responder(i)) for i, rows in enumerate(requests)]
    run_now(scheduler, pending)
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
    run_now(scheduler, [Request(rows, answers.responder(0))])
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
    run_now(scheduler, [Request(rows, answers.responder(0))])
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
    pending = [Request(r, answers.responder(i)) for i, r in enumerate(good)]
    pending.append(Request(bad, answers.responder(99)))
    run_now(scheduler, pending)
    for i, rows in enumerate(good):
        assert_answer_matches(answers.by_request[i], rows)
    _, _, error = answers.by_request[99]
    assert isinstance(error, ServeError) and error.kind is ErrorKind.FAILED
    assert "row 0 (3 tokens) failed even alone" in str(error) and "engine fault" in str(error)


@pytest.mark.parametrize("overlap", [False, True], ids=["inline", "overlapped"])
def test_a_non_finite_output_is_never_answered(overlap):
    """A row whose output comes out NaN or infinite is run once more alone: answered from that
    forward when it is finite there (an overflow that depends on its companions), else its
    request fails with NON_FINITE, counted and logged. Every other row is answered from its
    first forward, each request exactly once."""
    always, in_company = 4242, 4343

    class NonFiniteEngine(FakeChecksumEngine):
        def run(self, input_ids, attention_mask):
            outputs = super().run(input_ids, attention_mask)
            outputs[(input_ids == always).any(axis=1)] = np.nan
            if len(input_ids) > 1:
                outputs[(input_ids == in_company).any(axis=1), 1] = np.inf
            return outputs

    engine = NonFiniteEngine(layout())
    logged: list[str] = []
    refused = []

    class Counted(SchedulerMetrics):
        def refused(self, reason, priority=1):
            refused.append(reason)

    scheduler = scheduler_for(
        engine, overhead=10_000, overlap=overlap, log=logged.append, metrics=Counted()
    )
    answers = Answers()
    rng = np.random.default_rng(3)
    good = [make_rows(rng, 3, max_len=15) for _ in range(4)]
    saved = [np.array([5, in_company, 7]), np.array([1, 2])]
    lost = [np.array([8, 9]), np.array([5, always, 7])]
    requests = [Request(r, answers.responder(i)) for i, r in enumerate([*good, saved, lost])]
    run_now(scheduler, requests)
    for i, rows in enumerate([*good, saved]):
        assert_answer_matches(answers.by_request[i], rows)
    _, _, error = answers.by_request[len(good) + 1]
    assert isinstance(error, ServeError) and error.reason is Reason.NON_FINITE
    assert error.kind is ErrorKind.FAILED
    assert str(error).startswith("row 1 (3 tokens): the model's output is NaN or infinite")
    assert refused == [Reason.NON_FINITE]
    assert logged and all("came out NaN or infinite" in line for line in logged)
    assert engine.calls[0][0] > 1 and engine.calls.count((1, 16)) >= 2  # each alone, once more
    scheduler.stop()


def test_finite_rows_are_told_apart_exactly():
    from python_backend.scheduling.runners import finite_rows

    outputs = np.ones((5, 8), np.float32)
    assert finite_rows(outputs).tolist() == [True] * 5
    outputs[1, 3] = np.nan
    outputs[2, 0], outputs[2, 1] = np.inf, -np.inf  # their sum is NaN
    outputs[3, 7] = -np.inf
    outputs[4] = 3e38  # finite, though the sum of the row overflows
    assert finite_rows(outputs).tolist() == [True, False, False, False, True]


def test_an_engine_that_answers_fewer_rows_than_it_was_given_mixes_up_no_answers():
    engine = FakeChecksumEngine(layout(max_rows=8))
    checked = engine.run

    def one_short(input_ids, attention_mask):  # drops the last row of any forward of many
        outputs = checked(input_ids, attention_mask)
        return outputs[:-1] if len(outputs) > 1 else outputs

    engine.run = one_short  # type: ignore[method-assign]
    scheduler = scheduler_for(engine, overhead=10_000)  # one forward for every row at first
    answers = Answers()
    rng = np.random.default_rng(2)
    requests = [make_rows(rng, 2, max_len=15) for _ in range(3)]
    run_now(scheduler, [Request(rows, answers.responder(i)) for i, rows in enumerate(requests)])
    assert engine.calls[0][0] == 6, "the first forward carried every row"
    for i, rows in enumerate(requests):  # each row retried until it ran alone, none misplaced
        assert_answer_matches(answers.by_request[i], rows)


def test_a_full_queue_refuses_at_once_and_says_so():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, max_queue_rows=5)
    answers = Answers()
    scheduler.submit(Request([np.arange(1, 4)] * 4, answers.responder(0)))
    scheduler.submit(Request([np.arange(1, 4)] * 2, answers.responder(1)))
    _, _, error = answers.by_request[1]
    assert (
        error.kind is ErrorKind.QUEUE_FULL
        and "queue full" in str(error)
        and "limit is 5" in str(error)
    )
    assert 0 not in answers.by_request  # the first is queued, not refused


def test_expired_and_cancelled_requests_are_answered_without_compute():
    now = [100.0]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, clock=lambda: now[0])
    answers = Answers()
    expired = Request([np.arange(1, 4)], answers.responder(0), deadline=99.0)
    cancelled = Request([np.arange(1, 4)], answers.responder(1), is_cancelled=lambda: True)
    fine = Request([np.arange(1, 4)], answers.responder(2), deadline=101.0)
    run_now(scheduler, [expired, cancelled, fine])
    assert answers.by_request[0][2].kind is ErrorKind.TIMEOUT
    assert answers.by_request[1][2].kind is ErrorKind.CANCELLED
    assert answers.by_request[2][2] is None
    assert engine.calls == [(1, 16)]


def test_oldest_requests_run_first():
    engine = FakeChecksumEngine(layout(max_rows=1))
    scheduler = scheduler_for(engine, overhead=0)
    order = []
    pending = [
        Request(
            [np.arange(1, n + 1)],
            lambda outcome, key=i: order.append(key),
        )
        for i, n in enumerate((60, 5, 30, 10))
    ]
    run_now(scheduler, pending)
    assert order == [0, 1, 2, 3]


def test_requests_arriving_during_a_forward_are_collected_together_next():
    gate = threading.Event()
    engine = FakeChecksumEngine(layout(max_rows=8), gate=gate)
    scheduler = scheduler_for(engine, overhead=64)
    answers = Answers()
    scheduler.start()
    try:
        scheduler.submit(Request([np.arange(1, 5)], answers.responder(0)))
        assert engine.wait_for_calls(1)  # the first forward is now waiting at the gate
        for i in range(1, 7):
            scheduler.submit(Request([np.arange(1, 5)], answers.responder(i)))
        gate.set()
        answers.wait_for(7)
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
        scheduler.submit(Request([np.arange(1, 9)], answers.responder(i)))
    scheduler.stop()
    scheduler.submit(Request([np.arange(1, 9)], answers.responder(10)))
    assert len(answers.by_request) == 11
    assert all(answers.by_request[i][2] is None for i in range(10))
    assert answers.by_request[10][2].kind is ErrorKind.SHUTDOWN


@pytest.mark.parametrize("planner", ["dp", "per_bucket"])
def test_both_planners_serve_the_same_answers(planner):
    rng = np.random.default_rng(3)
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, policy=planner)
    answers = Answers()
    requests = [make_rows(rng, 4) for _ in range(10)]
    run_now(scheduler, [Request(r, answers.responder(i)) for i, r in enumerate(requests)])
    for i, rows in enumerate(requests):
        assert_answer_matches(answers.by_request[i], rows)


def test_a_slow_response_does_not_hold_up_the_next_forward():
    engine = FakeChecksumEngine(layout(max_rows=1))
    scheduler = scheduler_for(engine, overhead=0)
    release = threading.Event()
    threads, answered = [], []

    def slow(outcome):
        threads.append(threading.current_thread().name)
        release.wait(10)  # the client side of the first response is slow
        answered.append("slow")

    scheduler.start()
    try:
        scheduler.submit(Request([np.arange(1, 5)], slow))
        scheduler.submit(Request([np.arange(1, 40)], lambda outcome: answered.append("next")))
        assert engine.wait_for_calls(2), "the second forward ran while the first response was sent"
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
    request = Request(
        [np.arange(1, 9)] * 6, answers.responder(0), is_cancelled=lambda: asked.append(1) or False
    )
    run_now(scheduler, [request])
    assert engine.calls == [(6, 16)]
    assert len(asked) == 2  # once when the collection is taken, once before its one forward
    assert_answer_matches(answers.by_request[0], request.rows)


def test_a_step_runs_without_threads_on_an_injected_clock():
    now = [10.0]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, clock=lambda: now[0])
    answers = Answers()
    scheduler.submit(Request([np.arange(1, 4)], answers.responder(0), deadline=10.5))
    now[0] = 11.0  # past its deadline before any step ran
    scheduler.submit(Request([np.arange(1, 6)], answers.responder(1), deadline=12.0))
    forwards = scheduler.step()
    assert answers.by_request[0][2].kind is ErrorKind.TIMEOUT
    assert [(f.padded_length, len(f.rows)) for f in forwards] == [(16, 1)]
    assert forwards[0].oldest_arrived_at == 11.0  # ages are measured on the injected clock
    assert_answer_matches(answers.by_request[1], [np.arange(1, 6)])
    assert scheduler.step() == []  # nothing queued: nothing planned


class WaitForFour(Policy):
    """A sibling policy that waits: runs only once 4 rows are queued or the oldest has waited
    50 ms (a bounded wait for a fuller collection, as a dynamic batcher's max queue delay)."""

    def __init__(self) -> None:
        super().__init__(PLANNERS["per_bucket"], "wait-for-four")

    def plan(self, rows, now, layout, cost) -> PolicyPlan:
        oldest = min(rows.arrived_at)
        if len(rows) >= 4 or now - oldest >= 0.05:
            return super().plan(rows, now, layout, cost)
        return PolicyPlan([], waiting=list(range(len(rows))), wake_at=oldest + 0.05)


def test_a_policy_can_wait_and_the_step_keeps_its_rows_queued_in_order():
    now = [0.0]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, clock=lambda: now[0], policy=WaitForFour())
    answers = Answers()
    for i in range(3):
        scheduler.submit(Request([np.arange(1, 4 + i)], answers.responder(i)))
    assert scheduler.step() == [] and not answers.by_request  # waiting for a fourth row
    now[0] = 0.01
    scheduler.submit(Request([np.arange(1, 9)], answers.responder(3)))
    forwards = scheduler.step()
    assert [len(f.rows) for f in forwards] == [4] and engine.calls == [(4, 16)]
    for i in range(3):
        assert_answer_matches(answers.by_request[i], [np.arange(1, 4 + i)])
    # alone, a row waits until the oldest has waited 50 ms on the clock, then runs
    scheduler.submit(Request([np.arange(1, 3)], answers.responder(4)))
    now[0] = 0.03
    assert scheduler.step() == []
    now[0] = 0.07
    assert [len(f.rows) for f in scheduler.step()] == [1]
    assert_answer_matches(answers.by_request[4], [np.arange(1, 3)])


def test_a_failed_forward_is_replanned_by_the_same_policy_under_a_smaller_budget():
    seen = []

    class Recording(Policy):
        def regroup(self, lengths, layout, cost):
            seen.append([layout.max_rows(t) for t in (16, 32, 64)])
            return super().regroup(lengths, layout, cost)

    def oom(ids, mask):
        return MemoryError("out of memory") if ids.size > 128 else None

    engine = FakeChecksumEngine(layout(max_rows=8), fail=oom)
    scheduler = scheduler_for(engine, overhead=1000, policy=Recording(PLANNERS["dp"]))
    answers = Answers()
    rows = [np.arange(1, 30) for _ in range(8)]
    run_now(scheduler, [Request(rows, answers.responder(0))])
    assert_answer_matches(answers.by_request[0], rows)
    assert seen and seen[0] == [8, 4, 2]  # 8 rows x 32 failed: budget 128 tokens a forward


def test_stop_reports_a_forward_that_did_not_end_and_its_answer_is_still_sent():
    gate = threading.Event()
    engine = FakeChecksumEngine(layout(), gate=gate)
    scheduler = scheduler_for(engine)
    answers = Answers()
    scheduler.start()
    scheduler.submit(Request([np.arange(1, 5)], answers.responder(0)))
    assert engine.wait_for_calls(1)
    assert scheduler.stop(timeout_s=0.1) is False  # the forward is stuck at the gate
    gate.set()  # it ends after the responder was told to stop: the answer is not dropped
    assert answers.wait_for(1)
    assert_answer_matches(answers.by_request[0], [np.arange(1, 5)])


def test_stop_reports_success_when_everything_ended():
    scheduler = scheduler_for(FakeChecksumEngine(layout()))
    scheduler.start()
    assert scheduler.stop(timeout_s=5) is True


def test_a_light_client_is_served_in_the_next_step_past_a_heavy_clients_full_queue():
    """A heavy client fills the queue with 8-row requests; a light client's one row is still
    admitted (it is under its share) and runs in the first step, beside one round's quantum of
    the heavy client's rows, not after all of them; the heavy client's next request is
    refused, the light one's not."""
    engine = FakeChecksumEngine(layout(max_rows=8))
    scheduler = scheduler_for(engine, overhead=64, max_queue_rows=256)
    answers = Answers()
    rng = np.random.default_rng(3)
    heavy = [make_rows(rng, 8) for _ in range(32)]
    for i, rows in enumerate(heavy):
        scheduler.submit(Request(rows, answers.responder(i), client="heavy"))
    light_rows = make_rows(rng, 1)
    scheduler.submit(Request(light_rows, answers.responder(200), client="light"))
    scheduler.submit(Request(make_rows(rng, 8), answers.responder(100), client="heavy"))
    refused = answers.by_request[100][2]
    assert refused.kind is ErrorKind.QUEUE_FULL and "its share of 2 clients is 128" in str(refused)
    assert 200 not in answers.by_request  # admitted past the bound: it was under its share
    steps = 0
    while 200 not in answers.by_request:
        scheduler.step()
        steps += 1
    assert steps == 1
    assert sum(1 for i in range(32) if i in answers.by_request) == 8  # one quantum: 64 rows
    assert_answer_matches(answers.by_request[200], light_rows)
    while len(answers.by_request) < 34:
        scheduler.step()
    for i, rows in enumerate(heavy):
        assert_answer_matches(answers.by_request[i], rows)


def test_a_step_running_one_clients_backlog_gives_way_to_a_newcomer_after_one_forward():
    """One client queues 32 requests of 8 rows while a forward runs: the next step takes them
    all (one client) and plans about 40 forwards. A second client's row arriving during that
    step is answered after the forward then running and one round of shares, not after all of
    them; the first client's requests, some cut across steps, are each answered once with all
    their rows."""
    gate = threading.Event()

    class SlowEngine(FakeChecksumEngine):
        def run(self, input_ids, attention_mask):
            time.sleep(0.02)  # forwards take time: the backlog takes about 0.8 s
            return super().run(input_ids, attention_mask)

    engine = SlowEngine(layout(max_rows=8), gate=gate)
    scheduler = scheduler_for(engine, overhead=64)
    answers = Answers()
    rng = np.random.default_rng(5)
    heavy = {i: make_rows(rng, 8) for i in range(32)}
    calls_when_light_answered = []
    light_rows = make_rows(rng, 1)

    def light_respond(outcome):
        calls_when_light_answered.append(len(engine.calls))
        answers.responder(100)(outcome)

    scheduler.start()
    try:
        scheduler.submit(Request(make_rows(rng, 1), answers.responder(99), client="heavy"))
        assert engine.wait_for_calls(1)  # held at the gate: the heavy backlog queues behind it
        for i, rows in heavy.items():
            scheduler.submit(Request(rows, answers.responder(i), client="heavy"))
        gate.set()
        assert engine.wait_for_calls(3)
        scheduler.submit(Request(light_rows, light_respond, client="light"))
        assert answers.wait_for(34, timeout_s=10)
    finally:
        scheduler.stop()
    planned = len(engine.calls)
    # after the forward running when it came, and one round of the heavy client's quantum (64
    # rows: about 8 forwards of this layout's 8 rows); not after the 40 of the backlog
    assert calls_when_light_answered and calls_when_light_answered[0] <= 3 + 1 + 12 < planned
    assert_answer_matches(answers.by_request[100], light_rows)
    for i, rows in heavy.items():
        assert_answer_matches(answers.by_request[i], rows)


def test_a_client_answered_as_fast_as_it_sends_never_holds_the_others_back():
    """A light client sends its next row as soon as one is answered, so it is a newcomer after
    every forward. A step gives way to it only once every client of the step has had a forward:
    the heavy client's rows run in every step, not never (its requeued rows are not charged to
    its share either)."""
    engine = FakeChecksumEngine(layout(max_rows=8))
    scheduler = scheduler_for(engine, overhead=0)  # the light row never shares a forward
    answers = Answers()
    heavy = [[np.arange(100 + k, 160 + k) for _ in range(8)] for k in range(8)]
    for k, rows in enumerate(heavy):
        scheduler.submit(Request(rows, answers.responder(k), client="heavy"))
    sent = iter(range(100, 140))

    def send_light() -> None:
        key = next(sent)
        respond = answers.responder(key)

        def respond_then_send_again(outcome):
            respond(outcome)
            send_light()

        scheduler.submit(Request([np.arange(1, 6)], respond_then_send_again, client="light"))

    send_light()
    for _ in range(12):
        scheduler.step()
    assert all(k in answers.by_request for k in range(8)), sorted(answers.by_request)
    for k, rows in enumerate(heavy):
        assert_answer_matches(answers.by_request[k], rows)
    assert sum(1 for key in answers.by_request if key >= 100) >= 8  # the light client too


def test_with_clients_sharing_a_step_the_lightest_clients_forward_runs_first():
    engine = FakeChecksumEngine(layout(max_rows=8))
    scheduler = scheduler_for(engine, overhead=0)
    order = []
    rng = np.random.default_rng(9)
    for i in range(4):  # the heavy client's 32 rows, older, of every length
        scheduler.submit(Request(make_rows(rng, 8), lambda o, k=i: order.append(k), client="h"))
    scheduler.submit(Request([np.arange(1, 40)], lambda o: order.append("light"), client="l"))
    scheduler.step()
    assert order[0] == "light" and sorted(map(str, order[1:])) == ["0", "1", "2", "3"]


class ClockedEngine(FakeChecksumEngine):
    """Each forward takes 0.5 s of the injected clock."""

    def __init__(self, now: list[float]) -> None:
        super().__init__(layout())
        self.now = now

    def run(self, input_ids, attention_mask):
        self.now[0] += 0.5
        return super().run(input_ids, attention_mask)


class StageRecorder:
    def __init__(self) -> None:
        self.answered_times: list[tuple[float, float]] = []

    def answered(self, queue_s: float, inference_s: float, *_class_and_rows) -> None:
        self.answered_times.append((queue_s, inference_s))

    def __getattr__(self, name):  # every other metric: ignored
        return lambda *args: None


def test_an_answer_says_how_long_it_queued_and_how_long_it_computed():
    """Queue: arrival to its first forward's start; inference: that start to its last row."""
    now = [100.0]
    engine = ClockedEngine(now)
    recorder = StageRecorder()
    # max_batch 8: twelve rows of one length take two forwards
    scheduler = scheduler_for(engine, clock=lambda: now[0], metrics=recorder)
    answers = Answers()
    scheduler.submit(Request([np.arange(1, 4)] * 12, answers.responder(0)))  # at 100.0
    now[0] = 101.0
    scheduler.submit(Request([np.arange(1, 4)], answers.responder(1)))  # at 101.0
    now[0] = 102.0
    scheduler.step()
    assert sorted(answers.by_request) == [0, 1]
    # the first starts at 102.0 and needs both forwards (done at 103.0); the second's one row
    # runs in one of them (102.0 to 102.5, or 102.5 to 103.0, by where the plan put it)
    (q0, i0), (q1, i1) = sorted(recorder.answered_times, key=lambda t: -t[0])
    assert (q0, i0) == (2.0, 1.0)
    assert q1 in (1.0, 1.5) and i1 == 0.5


def test_ids_are_checked_against_the_vocabulary_by_their_own_bits():
    """Pair rows carry each token's type above the id's bits: those rows are checked by the ids
    themselves, and a negative id is outside any vocabulary."""
    from python_backend.common.contract import ids_in_vocabulary, pack_token_types

    ids = np.array([[101, 7, 102, 9, 102]], np.int64)
    types = np.array([[0, 0, 0, 1, 1]], np.int64)
    assert ids_in_vocabulary(ids, 103) and ids_in_vocabulary(pack_token_types(ids, types), 103)
    assert not ids_in_vocabulary(pack_token_types(ids, types), 102)
    assert not ids_in_vocabulary(np.array([[5, -1]], np.int64), 103)
    assert not ids_in_vocabulary(pack_token_types(np.array([[5, -1]]), np.array([[1, 1]])), 103)
