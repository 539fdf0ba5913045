"""Service classes (``Request.priority``, 1 first): the queue's admission by class, the step that
serves the highest class first with the next class's requests riding where that costs less,
the cap on a lower class's forwards while a higher one is about, the step yielding to a higher
class, and the share that keeps a lower class from starving. Every request is answered once."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from python_backend.common.contract import Reason
from python_backend.common.cost_models import LinearCost
from python_backend.common.decoding import parse_options
from python_backend.common.engine_profiles import Bucket
from python_backend.engines.base import BucketLayout
from python_backend.scheduling.fair_queue import ClassedQueue
from python_backend.scheduling.policy import BudgetLayout, ServiceClasses, capped_layout
from python_backend.scheduling.records import Request
from python_backend.scheduling.scheduler import Scheduler
from python_backend.transport.wire import decode_submit, encode_submit
from testkit.fake_engine import FakeChecksumEngine, layout
from tests.unit.test_scheduler import Answers, assert_answer_matches, scheduler_for


def rows_of(length: int, count: int, start: int = 1) -> list[np.ndarray]:
    return [np.arange(start + k, start + k + length) for k in range(count)]


def test_a_full_queue_refuses_the_lowest_class_over_its_share_first():
    queue: ClassedQueue[str] = ClassedQueue(2, max_rows=10, quantum_rows=64)
    queue.push(2, "bulk", "b1", 10)  # the lower class fills the bound
    assert queue.refusal(1, "interactive", 8) is None, "a lower class's rows never count"
    queue.push(1, "interactive", "i1", 8)
    refused = queue.refusal(2, "bulk", 1)
    assert refused is not None and "class 2 and above" in refused
    assert queue.waiting() == [1, 2] and queue.higher_than(2) and not queue.higher_than(1)
    assert queue.take(1) == ["i1"] and queue.take(2) == ["b1"] and queue.waiting() == []


def test_the_higher_class_runs_first_and_a_lower_request_rides_where_it_costs_less():
    """Bulk rows ride in the interactive forward when one more row there costs less than its
    share of a forward of the bulk rows of its length (a large fixed cost); otherwise they wait
    for their own step. Riders make the interactive forward cost at most ``rider_factor`` times
    as much."""
    interactive, bulk = rows_of(60, 1), [rows_of(10, 2, start=100 + 10 * k) for k in range(3)]
    for overhead, factor, calls in (
        (1024.0, 2.0, [(7, 64)]),  # 1472 units: under twice 1088
        (300.0, 2.0, [(6, 64), (1, 16)]),  # a seventh row would pass twice 364: it runs later
        (300.0, 3.0, [(7, 64)]),  # 748 units: under three times 364
        (300.0, 1.0, [(1, 64), (6, 16)]),  # none: each costs more
        (64.0, 3.0, [(1, 64), (6, 16)]),  # 64 units more: the six together cost 160
        (0.0, 3.0, [(1, 64), (6, 16)]),
    ):
        engine = FakeChecksumEngine(layout())
        classes = ServiceClasses(rider_factor=factor)
        scheduler = scheduler_for(engine, overhead=overhead, classes=classes)
        answers = Answers()
        for k, rows in enumerate(bulk):
            scheduler.submit(Request(rows, answers.responder(k), priority=2))
        scheduler.submit(Request(interactive, answers.responder(9)))
        while scheduler.queued_rows:
            scheduler.step()
        assert engine.calls == calls, (overhead, factor)
        assert_answer_matches(answers.by_request[9], interactive)
        for k, rows in enumerate(bulk):
            assert_answer_matches(answers.by_request[k], rows)


def test_a_request_rides_in_part_and_runs_the_rest_after_the_step():
    """The rows of a bulk request short enough ride in the interactive forward; its longer
    rows stay queued and run in its own class's step, each row once, answered once."""
    interactive = rows_of(20, 1)
    bulk = [*rows_of(10, 2, start=100), *rows_of(50, 2, start=200)]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=100.0)
    answers = Answers()
    scheduler.submit(Request(bulk, answers.responder(1), priority=2))
    scheduler.submit(Request(interactive, answers.responder(0)))
    scheduler.step()
    assert engine.calls == [(3, 32)] and scheduler.queued_rows == 2
    assert 1 not in answers.by_request
    scheduler.step()
    assert engine.calls == [(3, 32), (2, 64)]
    assert_answer_matches(answers.by_request[0], interactive)
    assert_answer_matches(answers.by_request[1], bulk)
    assert len(answers.by_request) == 2  # a second answer fails in the responder


def test_an_interactive_forward_runs_longer_to_take_riders_of_that_length():
    """Where the bulk rows queued are all longer than the interactive row, its forward runs at
    their length and takes them (its own row padded further) where that saves more than it
    costs (a large fixed cost); with a small fixed cost each runs at its own length."""
    for overhead, calls in ((1024.0, [(8, 64)]), (16.0, [(1, 16), (7, 64)])):
        engine = FakeChecksumEngine(layout())
        scheduler = scheduler_for(engine, overhead=overhead)
        answers = Answers()
        bulk, interactive = rows_of(60, 7, start=100), rows_of(10, 1)
        scheduler.submit(Request(bulk, answers.responder(1), priority=2))
        scheduler.submit(Request(interactive, answers.responder(0)))
        while scheduler.queued_rows:
            scheduler.step()
        assert engine.calls == calls, overhead
        assert_answer_matches(answers.by_request[0], interactive)
        assert_answer_matches(answers.by_request[1], bulk)


def test_riders_are_the_requests_with_rows_that_ride_not_the_first_in_line():
    """The room of an interactive forward goes to the bulk requests whose rows ride there: with
    a full forward's worth of short bulk rows queued first (cheaper in a forward of their own),
    the long rows queued behind them ride."""
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=64.0)
    answers = Answers()
    short, long = rows_of(10, 8, start=100), rows_of(60, 2, start=200)
    scheduler.submit(Request(short, answers.responder(1), client="a", priority=2))
    scheduler.submit(Request(long, answers.responder(2), client="b", priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()
    assert engine.calls == [(3, 64)], "the long rows ride: 64 units more, 72 alone each"
    while scheduler.queued_rows:
        scheduler.step()
    assert engine.calls[1:] == [(8, 16)]
    for k, rows in enumerate((rows_of(60, 1), short, long)):
        assert_answer_matches(answers.by_request[k], rows)


def test_with_overlap_a_request_riding_in_part_leaves_the_last_forward_in_flight():
    """A rider with rows left is queued again when the forward holding its rows completes, not
    by waiting for it at the step's end: the engine keeps running while the next step plans.
    Each row runs once."""
    interactive = rows_of(20, 1)
    bulk = [*rows_of(10, 2, start=100), *rows_of(50, 2, start=200)]
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=100.0, overlap=True)
    answers = Answers()
    scheduler.submit(Request(bulk, answers.responder(1), priority=2))
    scheduler.submit(Request(interactive, answers.responder(0)))
    scheduler.step(finish_last=False)
    assert scheduler.runner.in_flight and scheduler.queued_rows == 0, "held, not queued"
    assert not scheduler.step(finish_last=False), "nothing of it is queued while in flight"
    scheduler.settle()
    assert scheduler.queued_rows == 2 and engine.calls == [(3, 32)]
    scheduler.step()
    assert engine.calls == [(3, 32), (2, 64)]
    assert_answer_matches(answers.by_request[0], interactive)
    assert_answer_matches(answers.by_request[1], bulk)


def slow(per_token_s: float):
    """A forward that takes time in proportion to its padded tokens (the cap's measure)."""

    def wait(ids, mask):
        time.sleep(ids.size * per_token_s)

    return wait


@pytest.mark.parametrize("overlap", [False, True])
def test_a_lower_class_runs_capped_while_a_higher_one_is_about_and_yields_to_it(overlap):
    """A bulk step right after an interactive request runs forwards of about ``wait_s`` each;
    an interactive request arriving during the first ends the step after that forward and runs
    next (with ``overlap`` too, where the step's second forward was padded meanwhile). Without a
    higher class about, the bulk rows run as one forward."""
    classes = ServiceClasses(wait_s=0.02, recent_s=10.0)
    cap = capped_layout(layout(), LinearCost(64.0), 0.004, 2e-5)
    assert [cap.max_rows(t) for t in (16, 32, 64)] == [8, 4, 2]  # 200 units, 136 padded tokens

    answers = Answers()
    arrived: list[int] = []
    query = rows_of(5, 1, start=7)
    ran: list[set[int]] = []  # the first id of each row of each forward

    def first_forward_brings_a_query(ids, mask):
        ran.append(set(ids[:, 0].tolist()))
        time.sleep(ids.size * 1e-4)  # 1e-4 s a padded token: 5e-5 s a cost unit at one row
        if len(engine.calls) == 2 and not arrived:  # the first bulk forward
            arrived.append(1)
            scheduler.submit(Request(query, answers.responder(2)))

    engine = FakeChecksumEngine(layout(), fail=first_forward_brings_a_query)
    scheduler = scheduler_for(engine, overhead=64.0, classes=classes, overlap=overlap)
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()  # measures the engine: seconds per cost unit
    scheduler.submit(Request(rows_of(60, 8, start=50), answers.responder(1), priority=2))
    scheduler.step()
    (first,) = engine.calls[1:]  # the step yielded after its first forward
    assert first[1] == 64 and 1 < first[0] < 8, f"{first}: not capped"
    while scheduler.queued_rows:
        scheduler.step()
    # the interactive request ran next (bulk rows may ride with it: it had not waited)
    assert int(query[0][0]) in ran[2], "the interactive request ran next"
    bulk = engine.calls[3:]
    assert all(b < 8 and t == 64 for b, t in bulk), bulk
    assert sum(b for b, _ in engine.calls[1:]) == 9, "each row ran once"
    for k in range(3):
        assert answers.by_request[k][2] is None

    alone = FakeChecksumEngine(layout(), fail=slow(1e-4))
    scheduler = scheduler_for(alone, overhead=64.0, classes=classes, overlap=overlap)
    scheduler.submit(Request(rows_of(60, 8, start=50), Answers().responder(0), priority=2))
    scheduler.step()
    assert alone.calls == [(8, 64)]


def test_a_budget_counts_the_batch_the_engine_runs_and_riders_fill_to_a_captured_size():
    """Where the engine runs captured batch sizes (CUDA graphs), a capped forward holds the rows
    whose captured batch fits the budget (40 rows would run as 64), and an interactive forward
    takes riders up to the captured size whose cost stays within ``rider_factor`` (here twice)
    its own (a row more would run as the next size), not rows that would run as a larger
    batch."""
    captured = BucketLayout(
        tuple(Bucket(t, 64, 32, (1, 2, 4, 8, 16, 32, 64)) for t in (16, 32, 64)), 64, 64, None
    )
    budget = BudgetLayout(captured, 40 * 64)
    assert [budget.max_rows(t) for t in (16, 32, 64)] == [64, 64, 32]
    assert BudgetLayout(layout(lengths=(16, 32, 64), max_rows=64), 40 * 64).max_rows(64) == 40

    engine = FakeChecksumEngine(captured)
    scheduler = scheduler_for(engine, overhead=256.0, classes=ServiceClasses(rider_factor=2.0))
    answers = Answers()
    bulk = rows_of(60, 40, start=100)
    scheduler.submit(Request(bulk, answers.responder(1), priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()  # twice 320 units: 4 rows run as 4 (512 units), 5 would run as 8 (768)
    assert engine.calls == [(4, 64)], engine.calls
    while scheduler.queued_rows:
        scheduler.step()
    assert_answer_matches(answers.by_request[1], bulk)


@pytest.mark.parametrize("max_batch", [6, 40])
def test_riders_under_a_server_cap_between_captured_sizes(max_batch):
    """A server's max_batch between two captured batch sizes: forwards hold at most that many
    rows and run as the next captured size; riders are priced there, and every row is answered."""
    captured = BucketLayout(
        tuple(Bucket(t, 64, 32, (1, 2, 4, 8, 16, 32, 64)) for t in (16, 32, 64)), 64, 64, None
    )
    engine = FakeChecksumEngine(captured)
    scheduler = Scheduler(
        engine, pad_token_id=0, cost=LinearCost(256.0), max_batch=max_batch, max_queue_rows=1000
    )
    answers = Answers()
    bulk = rows_of(60, 50, start=100)
    scheduler.submit(Request(bulk, answers.responder(1), priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    while scheduler.queued_rows:
        scheduler.step()
    assert engine.calls and all(rows <= max_batch for rows, _ in engine.calls), engine.calls
    assert engine.calls[0][0] > 1, "bulk rows ride in the interactive forward"
    assert_answer_matches(answers.by_request[0], rows_of(60, 1))
    assert_answer_matches(answers.by_request[1], bulk)


def test_with_overlap_a_higher_class_is_planned_while_the_lower_forward_runs():
    """An interactive request arriving while a bulk forward runs ends the bulk step at once,
    not when that forward has run: the step returns with it still in flight (the bulk request,
    a row of it running, held until it completes), the interactive forward runs next, and every
    row runs once."""
    classes = ServiceClasses(wait_s=0.02, recent_s=10.0)
    answers = Answers()
    arrived = threading.Event()

    def first_bulk_forward_brings_a_query(ids, mask):
        if len(engine.calls) == 2 and not arrived.is_set():
            arrived.set()
            scheduler.submit(Request(rows_of(5, 1, start=7), answers.responder(2)))
            time.sleep(0.3)  # long enough that the step ends first
        else:
            time.sleep(ids.size * 1e-4)

    engine = FakeChecksumEngine(layout(), fail=first_bulk_forward_brings_a_query)
    scheduler = scheduler_for(engine, overhead=64.0, classes=classes, overlap=True)
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()  # measures the engine; the interactive class is now recent
    bulk = rows_of(60, 8, start=50)
    scheduler.submit(Request(bulk, answers.responder(1), priority=2))
    scheduler.step(finish_last=False)
    assert arrived.is_set() and len(engine.calls) == 2
    assert scheduler.runner.in_flight is not None, "the step waited for the bulk forward"
    assert scheduler.queued_rows == 1, "the bulk request is held while a row of it runs"
    scheduler.step()
    assert engine.calls[2] == (1, 16), "the interactive request ran next"
    while scheduler.queued_rows:
        scheduler.step()
    for k, rows in enumerate((rows_of(60, 1), bulk, rows_of(5, 1, start=7))):
        assert_answer_matches(answers.by_request[k], rows)


@pytest.mark.parametrize(
    "bulk_length, bulk_rows, overhead, calls",
    [
        # a full forward at 64: its last bulk row makes room, and runs after
        (60, 8, 64.0, [(8, 64), (8, 64), (1, 64)]),
        # room at 32: the short query rides; the long one's own forward costs less than the
        # bulk rows padded to 64 with it: it runs alone next
        (20, 4, 64.0, [(4, 32), (5, 32), (1, 64)]),
        # a forward's fixed cost larger than that padding: the bulk forward runs at 64 with both
        (20, 4, 1000.0, [(4, 32), (6, 64)]),
    ],
)
def test_a_lower_forward_planned_while_one_ran_carries_the_higher_class_that_came(
    bulk_length, bulk_rows, overhead, calls
):
    """With overlap, a bulk step is planned while the forward before it runs; interactive
    requests that come meanwhile would wait for its first forward anyway: each whose rows fit
    its length rides in it (a bulk row making room where it is full, run after); where a row is
    longer, the forward runs at its length if that costs less than a forward of its own after,
    else it runs in one next. Every row runs once, and every answer is its own rows'."""
    classes = ServiceClasses(wait_s=10.0, recent_s=10.0)
    answers = Answers()
    short, long = rows_of(5, 1, start=7), rows_of(40, 1, start=9)
    queries = [short] if bulk_length == 60 else [short, long]
    ran: list[set[int]] = []

    def first_forward_brings_queries(ids, mask):
        ran.append(set(ids[:, 0].tolist()))
        if len(engine.calls) == 1:  # while the next step is planned and waits for this one
            time.sleep(0.2)
            for k, rows in enumerate(queries):
                scheduler.submit(Request(rows, answers.responder(2 + k), client=f"q{k}"))
            time.sleep(0.1)

    engine = FakeChecksumEngine(layout(), fail=first_forward_brings_queries)
    scheduler = scheduler_for(engine, overhead=overhead, classes=classes, overlap=True)
    first = rows_of(bulk_length, bulk_rows, start=100)
    second = rows_of(bulk_length, bulk_rows, start=200)
    scheduler.submit(Request(first, answers.responder(0), client="bulk", priority=2))
    scheduler.step(finish_last=False)
    assert scheduler.runner.in_flight is not None
    scheduler.submit(Request(second, answers.responder(1), client="bulk", priority=2))
    scheduler.step()
    while scheduler.queued_rows:
        scheduler.step()
    assert engine.calls == calls
    assert int(short[0][0]) in ran[1], "the short query rode in the bulk step's first forward"
    if bulk_length == 60:
        assert len(ran[1] & {200 + k for k in range(8)}) == 7, "one bulk row made room"
    for k, rows in enumerate([first, second, *queries]):
        assert_answer_matches(answers.by_request[k], rows)


@pytest.mark.parametrize("bulk_rows", [8, 5])
def test_a_starved_class_keeps_its_forward_and_carries_the_higher_class_in_room_left(bulk_rows):
    """A step serving a class under its share (a higher one waiting) runs its own rows: the
    higher class's requests ride only in the room its forward has left, never in place of
    them, and run next otherwise. Every row runs once."""
    ran: list[set[int]] = []

    def record(ids, mask):
        ran.append(set(ids[:, 0].tolist()))

    engine = FakeChecksumEngine(layout(), fail=record)
    classes = ServiceClasses(wait_s=10.0, min_share=0.9)
    scheduler = scheduler_for(engine, overhead=64.0, classes=classes)
    answers = Answers()
    sent = {0: rows_of(60, 1, start=300)}
    scheduler.submit(Request(sent[0], answers.responder(0)))
    scheduler.step()  # class 1 has all the engine's recent work
    sent[1] = rows_of(60, bulk_rows, start=100)
    scheduler.submit(Request(sent[1], answers.responder(1), client="bulk", priority=2))
    for k in range(2, 8):
        sent[k] = rows_of(5, 1, start=10 * k)
        scheduler.submit(Request(sent[k], answers.responder(k), client=f"q{k}"))
    scheduler.step()
    assert engine.calls[1] == (8, 64), "the starved class's forward, filled to the room left"
    assert {100 + k for k in range(bulk_rows)} <= ran[1], "none of its rows made room"
    while scheduler.queued_rows:
        scheduler.step()
    for k, rows in sent.items():
        assert_answer_matches(answers.by_request[k], rows)
    assert sum(b for b, _ in engine.calls) == 1 + bulk_rows + 6, "each row ran once"


def test_riders_keep_to_the_servers_batch_cap_and_never_cost_more_than_they_save():
    """An interactive forward takes riders up to the server's ``max_batch`` (below the engine's
    64 rows here); and none where the one rider there is would make the engine run a larger
    captured batch (1 row runs as 1, 2 as 8) than its share of a forward of its own saves."""
    engine = FakeChecksumEngine(layout(max_rows=64))
    scheduler = scheduler_for(engine, overhead=1024.0)  # max_batch 8
    answers = Answers()
    scheduler.submit(Request(rows_of(60, 20, start=100), answers.responder(1), priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()
    assert engine.calls == [(8, 64)]

    captured = BucketLayout(tuple(Bucket(t, 8, 8, (1, 8)) for t in (16, 32, 64)), 64, 8, None)
    engine = FakeChecksumEngine(captured)
    scheduler = scheduler_for(engine, overhead=100.0)
    scheduler.submit(Request(rows_of(60, 1, start=100), answers.responder(3), priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(2)))
    scheduler.step()  # 164 units alone; with the rider 612 (as 8 rows), for a share of 164
    assert engine.calls == [(1, 64)]
    while scheduler.queued_rows:
        scheduler.step()
    assert engine.calls == [(1, 64), (1, 64)]


def test_a_cap_longer_than_any_forward_leaves_the_step_whole():
    """While a higher class is about, a lower class's step takes rows for about one capped
    forward per length; where ``wait_s`` buys more than the longest forward, nothing is capped
    and the step plans its whole queue (a part would group worse)."""
    for wait_s, whole in ((100.0, True), (1e-5, False)):  # 1e-5: under one row's forward
        engine = FakeChecksumEngine(layout(), fail=slow(1e-6))
        classes = ServiceClasses(wait_s=wait_s, recent_s=10.0)
        scheduler = scheduler_for(engine, overhead=64.0, classes=classes)
        answers = Answers()
        scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
        scheduler.step()  # measures the engine; the interactive class is now recent
        bulk = [rows_of(60, 8, start=50 + 10 * k) for k in range(5)]
        for k, rows in enumerate(bulk):
            scheduler.submit(Request(rows, answers.responder(1 + k), priority=2))
        step = scheduler.step()
        planned = sum(len(f.rows) for f in step)
        assert (planned == 40) == whole, (wait_s, [(len(f.rows), f.padded_length) for f in step])
        if whole:
            assert [len(f.rows) for f in step] == [8] * 5  # full forwards
        while scheduler.queued_rows:
            scheduler.step()
        for k, rows in enumerate(bulk):
            assert_answer_matches(answers.by_request[1 + k], rows)


def test_a_lower_class_gets_its_share_under_a_saturating_higher_one():
    """Interactive requests fill every forward and always wait; the bulk request is still run
    within a few steps (its share of the engine's recent work is under ``min_share``)."""
    engine = FakeChecksumEngine(layout(), fail=slow(1e-6))
    scheduler = scheduler_for(engine, overhead=64.0, classes=ServiceClasses(min_share=0.2))
    answers = Answers()
    scheduler.submit(Request(rows_of(60, 8, start=500), answers.responder(99), priority=2))
    for k in range(6):
        scheduler.submit(Request(rows_of(60, 8, start=10 * k), answers.responder(k)))
        scheduler.step()
        if 99 in answers.by_request:
            break
    assert 99 in answers.by_request and answers.by_request[99][2] is None
    assert k <= 2, f"the bulk request waited {k + 1} steps"


def test_a_class_the_model_does_not_have_is_refused_naming_priority():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine)
    answers = Answers()
    scheduler.submit(Request(rows_of(4, 1), answers.responder(0), priority=3))
    error = answers.by_request[0][2]
    assert error.reason == Reason.BAD_PARAMETER and "parameter priority is 3," in str(error)
    assert "(1 to 2, 1 first)" in str(error) and not engine.calls


def test_the_class_parameter_is_read_from_the_body_checks_number_or_a_header_text():
    options = parse_options({"x-planner-class": 2}, True, 0)
    assert options.priority == 2
    assert parse_options({"x-planner-class": "2"}, True, 0).priority == 2
    assert parse_options({}, True, 0).priority == 1  # absent or 0: the default class
    assert parse_options({"x-planner-class": 0}, True, 0).priority == 1
    for bad in (-1, "high", True, 1.5):
        try:
            parse_options({"x-planner-class": bad}, True, 0)
        except Exception as err:
            assert "parameter priority" in str(err)
        else:
            raise AssertionError(f"{bad!r} was taken")


def test_the_class_crosses_from_a_front_to_its_queue_owner():
    requests = [
        Request(rows_of(3, 2), lambda _: None, client="a", priority=2),
        Request(rows_of(4, 1), lambda _: None, client="b"),
    ]
    frames = encode_submit([1, 2], requests, now=0.0)
    decoded = decode_submit(frames, 0.0, lambda _: (lambda _: None, lambda: False))
    assert [(r.client, r.priority) for r in decoded] == [("a", 2), ("b", 1)]


def test_stopping_answers_every_class_queued():
    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine)
    answers = Answers()
    for k in range(4):
        scheduler.submit(
            Request(rows_of(4, 1), answers.responder(k), client=str(k), priority=1 + k % 2)
        )
    assert scheduler.stop(1.0)
    assert {k: answers.by_request[k][2].reason for k in range(4)} == {
        k: Reason.SHUTDOWN for k in range(4)
    }


def test_riders_are_taken_whole_in_turn_at_least_one_and_never_past_the_room():
    queue: ClassedQueue[str] = ClassedQueue(3, max_rows=100, quantum_rows=64)
    for k, rows in enumerate((4, 3, 5, 2)):
        queue.push(3, "a", f"a{k}", rows)
    queue.push(3, "b", "b0", 2)
    queue.push(1, "c", "c0", 1)
    rows = {"a0": 4, "a1": 3, "a2": 5, "a3": 2, "b0": 2}.__getitem__
    assert queue.take_rows(1, 9, rows) == (3, ["a0", "b0", "a1"])  # class 2 has none: the next
    assert queue.take_rows(1, 4, rows) == (3, ["a2"])  # 5 rows: the first, however large
    assert queue.take_rows(2, 5, rows) == (3, ["a3"]) and queue.waiting() == [1]
    assert queue.take_rows(1, 5, rows) == (0, [])
    # riders counted by their rows that can ride: a head with none keeps its place, and the
    # requests behind it are taken
    for name in ("e0", "e1", "e2"):
        queue.push(2, "e", name, 4)
    queue.push(2, "f", "f0", 4)
    usable = {"e0": 0, "e1": 3, "e2": 5, "f0": 2}
    assert queue.take_rows(1, 4, usable.__getitem__) == (2, ["e1", "f0"])
    assert queue.take_rows(1, 9, usable.__getitem__) == (2, ["e2"])
    assert queue.take_rows(1, 9, usable.__getitem__) == (2, []) and queue.take_rows_of(2, 1) == [
        "e0"
    ]
    # a capped step takes at least one request, however large, so it always makes progress
    queue.push(2, "d", "d0", 64)
    queue.push(2, "d", "d1", 1)
    assert queue.take_rows_of(2, 6) == ["d0"] and queue.take_rows_of(2, 6) == ["d1"]


def test_a_keys_class_is_its_default_and_the_highest_it_may_ask_for():
    key = {"x-planner-key-class": "2"}  # the front door's header, as Triton forwards it
    assert parse_options(key, True, 0).priority == 2
    assert parse_options({**key, "x-planner-class": 3}, True, 0).priority == 3
    try:
        parse_options({**key, "x-planner-class": 1}, True, 0)
    except Exception as err:
        assert "parameter priority is 1; this API key may ask for class 2 at most" in str(err)
    else:
        raise AssertionError("a key of class 2 asked for class 1")


def test_an_internal_error_answers_the_riders_too():
    """A step that fails inside (here its metrics) answers every request it took, the next
    class's riders included: none is left unanswered in a forward that never completed."""
    from python_backend.scheduling.scheduler import SchedulerMetrics

    class Broken(SchedulerMetrics):
        def forward(self, *args) -> None:
            raise RuntimeError("metrics broke")

    engine = FakeChecksumEngine(layout())
    scheduler = scheduler_for(engine, overhead=1024.0, metrics=Broken())
    answers = Answers()
    scheduler.submit(Request(rows_of(10, 2, start=100), answers.responder(1), priority=2))
    scheduler.submit(Request(rows_of(60, 1), answers.responder(0)))
    scheduler.step()
    assert engine.calls == [(3, 64)], "the class-2 request rode in the class-1 forward"
    assert {k: answers.by_request[k][2].reason for k in (0, 1)} == {
        0: Reason.INTERNAL,
        1: Reason.INTERNAL,
    }


class TimedEngine(FakeChecksumEngine):
    """Each forward takes its cost in microseconds of the test's clock (``now``) as it runs
    (once its gate is open)."""

    def __init__(self, cost: LinearCost, now: list[float]) -> None:
        super().__init__(layout(), gate=threading.Event())
        self.cost, self.now = cost, now
        self.gate.set()

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        outputs = super().run(input_ids, attention_mask)
        self.now[0] += self.cost.cost(*input_ids.shape) * 1e-6
        return outputs


@pytest.mark.parametrize(
    ("flying_for", "waited", "behind", "factor", "wait", "rows"),
    [
        (None, 0, False, 1.0, 1300, 4),  # 1300 units: 1024 + 4 * 64 (1088 by its own rows alone)
        (None, 1200, False, 1.0, 1300, 2),  # by 1300 + 1088 - 1200 = 1188 units after it came
        (None, 1300, False, 1.0, 1300, 1),  # waited the capped forward: its own rows' cost
        (None, 0, True, 1.0, 1300, 1),  # a row of its class queued behind it would wait it too
        (0, 0, False, 1.0, 1300, 1),  # a bulk forward of 1280 units ahead: 1300 + 1088 - 1280
        (1000, 0, False, 1.0, 1300, 4),  # 280 units of it left: 1300 again
        (None, 1300, False, 1.2, 1500, 4),  # the factor's 1305.6 units, more than 1288
        (None, 1000, False, 1.2, 1500, 7),  # 1500 + 1088 - 1000 = 1588, capped: 1500, more
    ],
)
def test_an_interactive_forward_carries_riders_for_the_wait_it_was_spared(
    flying_for, waited, behind, factor, wait, rows
):
    """With ``rider_factor`` 1 riders never make a forward cost more than its own rows; but an
    interactive row may wait one capped forward (``wait_s``: 1300 units at 1 us a unit), and
    what it did not wait, for the forward in flight (with overlap) or since it came, its own
    forward may spend on riders: it ends by then plus its own rows' cost, never longer than a
    capped forward; not where a row of its class left queued would wait it too. Riders take
    that or ``rider_factor`` times its own cost, whichever is more. Every row is answered
    once."""
    now = [0.0]
    cost = LinearCost(1024.0)
    engine = TimedEngine(cost, now)
    scheduler = scheduler_for(
        engine,
        overhead=1024.0,
        classes=ServiceClasses(wait_s=wait * 1e-6, rider_factor=factor),
        clock=lambda: now[0],
        timer=lambda: now[0],
        overlap=flying_for is not None,
    )
    answers = Answers()
    sent = {9: rows_of(60, 1, start=500)}
    scheduler.submit(Request(sent[9], answers.responder(9), priority=2))
    scheduler.step()  # measures the engine: 1 us a unit
    if flying_for is not None:
        engine.gate.clear()
        sent[8] = rows_of(60, 4, start=600)
        scheduler.submit(Request(sent[8], answers.responder(8), priority=2))
        scheduler.step(finish_last=False)
        assert engine.wait_for_calls(2) and engine.calls[-1] == (4, 64)
        assert scheduler.runner.in_flight is not None
        now[0] += flying_for * 1e-6
    for k in range(7):
        sent[k] = rows_of(60, 1, start=100 + k)
        scheduler.submit(Request(sent[k], answers.responder(k), priority=2))
    sent[10] = rows_of(60, 1)
    scheduler.submit(Request(sent[10], answers.responder(10)))
    now[0] += waited * 1e-6
    taken = scheduler.take()
    if behind:
        sent[11] = rows_of(60, 1, start=700)
        scheduler.submit(Request(sent[11], answers.responder(11)))
    forwards = scheduler.plan(scheduler.admit(taken), now[0])
    assert [(len(f.rows), f.padded_length) for f in forwards] == [(rows, 64)]
    engine.gate.set()
    for forward in forwards:
        scheduler.run(forward)
    scheduler.settle()
    while scheduler.queued_rows:
        scheduler.step()
    for k, sent_rows in sent.items():
        assert_answer_matches(answers.by_request[k], sent_rows)
