"""The queue shared between clients: deficit round-robin service, shares of a full queue."""

from __future__ import annotations

import random

import numpy as np

from python_backend.scheduling.fair_queue import FairQueue


def queue(max_rows: int = 128) -> FairQueue[str]:
    return FairQueue(max_rows, quantum_rows=64)


def test_one_client_gets_everything_at_once_in_order():
    q = queue()
    for i in range(5):
        q.push("", f"r{i}", 20)
    assert q.take() == [f"r{i}" for i in range(5)]
    assert len(q) == 0 and q.clients == 0 and q.take() == []


def test_a_light_client_waits_one_round_of_the_heavy_clients_rows_not_all_of_them():
    q = queue(max_rows=4096)
    for i in range(32):
        q.push("heavy", f"h{i}", 64)
    q.push("light", "l0", 1)
    assert q.take() == ["h0", "l0"]  # one round: a quantum of each
    assert len(q) == 64 * 31 and q.clients == 1
    assert q.take() == [f"h{i}" for i in range(1, 32)]  # alone again: everything


def test_many_light_clients_are_taken_together_in_one_step():
    q = queue(max_rows=4096)
    for i in range(200):
        q.push(f"c{i}", f"r{i}", 1)
    q.push("heavy", "h0", 64)
    q.push("heavy", "h1", 64)
    taken = q.take()
    assert len(taken) == 201 and "h1" not in taken


def test_two_busy_clients_share_the_steps_by_rows():
    q = queue(max_rows=10_000)
    for i in range(100):
        q.push("big", f"b{i}", 64)
        q.push("small", f"s{i}", 8)
    served = {"big": 0, "small": 0}
    for _ in range(10):  # both still waiting: small's 800 rows last 12 rounds of 64
        for item in q.take():
            served["big" if item[0] == "b" else "small"] += 64 if item[0] == "b" else 8
    # each client's deficit grows by 64 rows a turn: they get the same rows, within one request
    assert abs(served["big"] - served["small"]) <= 64


def test_a_full_queue_refuses_the_client_over_its_share_and_admits_the_one_under_it():
    q = queue(max_rows=128)
    q.push("heavy", "h0", 64)
    q.push("heavy", "h1", 64)
    refusal = q.refusal("heavy", 1)
    assert refusal is not None and "the limit is 128" in refusal
    assert q.refusal("light", 1) is None  # its share is 128 / 2 = 64
    q.push("light", "l0", 64)
    refusal = q.refusal("light", 1)
    assert refusal is not None and "this client holds 64, its share of 2 clients is 64" in refusal
    third = q.refusal("third", 42)  # its share is 128 / 3 = 42
    assert third is None and q.refusal("third", 43) is not None


def test_rows_queued_never_pass_twice_the_bound():
    rng = random.Random(7)
    q = queue(max_rows=256)
    for n in range(5000):
        client, rows = f"c{rng.randrange(12)}", rng.randint(1, 64)
        if q.refusal(client, rows) is None:
            q.push(client, f"{client}-{n}", rows)
        assert len(q) <= 2 * 256
        if rng.random() < 0.1:
            q.take()


def test_rows_a_step_returns_go_back_ahead_of_their_clients_lines():
    q = queue(max_rows=4096)
    q.push("a", "a0", 64)
    q.push("a", "a1", 64)
    q.push("b", "b0", 64)
    taken = q.take()
    assert taken == ["a0", "b0"]
    q.push_front([("a", "a0", 64)])
    assert q.rows_of("a") == 128 and len(q) == 128
    rest = q.take() + q.take()
    assert rest.index("a0") < rest.index("a1")


def test_a_client_that_empties_keeps_no_credit():
    q = queue(max_rows=4096)
    q.push("a", "a0", 1)
    q.push("b", "b0", 64)
    q.take()  # a spends 1 of its 64: the rest would be credit for later
    assert q.rows_of("a") == 0 and q.clients <= 1
    q.push("a", "a1", 64)
    q.push("a", "a2", 60)  # 63 rows of saved credit would pay for it in the same round
    q.push("b", "b1", 64)
    assert q.take() == ["a1", "b1"]


def test_the_measure_of_what_is_queued_follows_every_way_in_and_out():
    """Items' measures (rows by length, for the scheduler) summed over what the queue holds,
    through pushes, rounds, counted and row-limited takes, and returns, checked against a
    recount after each operation in a random sequence."""
    measure = {f"r{i}": np.array([i % 3, i % 5, 1]) for i in range(400)}
    q: FairQueue[str] = FairQueue(4096, quantum_rows=8, measure=measure.__getitem__)
    held: dict[str, str] = {}  # item -> client, what the queue holds
    rng = random.Random(1)
    names = iter(measure)
    for _ in range(300):
        op = rng.choice(["push", "push", "take", "take_rows", "take_counted"])
        taken: list[str] = []
        if op == "push":
            name, client = next(names), rng.choice("abc")
            q.push(client, name, rng.randint(1, 8))
            held[name] = client
        elif op == "take":
            taken = q.take()
        elif op == "take_rows":
            taken = q.take_rows(rng.randint(1, 20), at_least_one=rng.random() < 0.5)
        elif op == "take_counted":
            taken = q.take_counted(rng.randint(1, 20), lambda name: int(name[1:]) % 2)
        if op != "push":
            clients = {name: held.pop(name) for name in taken}
            if op in ("take", "take_rows") and clients and rng.random() < 0.5:
                q.push_front((client, name, 3) for name, client in clients.items())
                held.update(clients)
        expected = sum((measure[name] for name in held), np.zeros(3, dtype=np.int64))
        assert q.measured is None or q.measured.tolist() == expected.tolist(), op


def test_requests_taken_by_rows_are_charged_and_returned_ones_refunded():
    """A request taken by ``take_rows`` or ``take_counted`` (a capped step, riders) is charged
    to its client's deficit as ``take`` charges it, and one given back is refunded: taking and
    returning leaves the next round as it was, and a client served that way waits its turn."""

    def filled() -> FairQueue[str]:
        q = queue(max_rows=4096)
        for i in range(4):
            q.push("a", f"a{i}", 40)
            q.push("b", f"b{i}", 40)
        return q

    untouched, returned = filled(), filled()
    for take in (lambda q: q.take_rows(40), lambda q: q.take_counted(40, lambda _: 40)):
        taken = take(returned)
        returned.push_front(("a" if name[0] == "a" else "b", name, 40) for name in taken)
    assert returned.take() == untouched.take()

    served = filled()
    assert served.take_counted(80, lambda name: 40 if name[0] == "a" else 0) == ["a0", "a1"]
    assert served.take() == ["b0"], "a's two rows ridden: its deficit is spent"
