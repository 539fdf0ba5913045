"""The queue owner and a front's client over a real ZeroMQ socket: every request answered once,
with its own rows' outputs, across the process boundary and across the owner's failures."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from python_backend.common.contract import Reason, ServeError
from python_backend.scheduling.records import Answer, Request, never_cancelled
from python_backend.transport.queue_owner import QueueOwner, owner_endpoint
from python_backend.transport.remote_owner import RemoteOwner
from python_backend.transport.wire import (
    SUBMIT,
    WireError,
    decode_answers,
    decode_submit,
    encode_answers,
    encode_submit,
)
from testkit.fake_engine import FakeChecksumEngine
from testkit.owner_process import fake_owner

ROOT = Path(__file__).resolve().parents[2]
WIDTH = FakeChecksumEngine.output_dim
WAIT_S = 10.0


class Answers:
    """Collects each request's outcome; fails a test that sees a second answer for one."""

    def __init__(self) -> None:
        self.outcomes: dict[int, object] = {}
        self._cond = threading.Condition()

    def respond_for(self, key: int):
        def respond(outcome) -> None:
            with self._cond:
                assert key not in self.outcomes, f"request {key} answered twice"
                self.outcomes[key] = outcome
                self._cond.notify_all()

        return respond

    def wait(self, count: int, timeout_s: float = WAIT_S) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.outcomes) >= count, timeout_s), (
                f"{len(self.outcomes)} of {count} answered"
            )


@pytest.fixture
def endpoint(tmp_path):
    return owner_endpoint(str(tmp_path / "sockets"), "m", 0)


def remote(endpoint, **kw) -> RemoteOwner:
    """A front's handle on the owner at ``endpoint``, started: connected."""
    client = RemoteOwner(endpoint, WIDTH, wait_s=WAIT_S, **kw)
    client.start()
    return client


def submit(client, rows, respond, timeout_s=None, is_cancelled=never_cancelled, client_name=""):
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    client.submit(Request(rows, respond, deadline, is_cancelled, client_name))


def wait_connected(client: RemoteOwner) -> None:
    deadline = time.monotonic() + WAIT_S
    while not client.ready():
        assert time.monotonic() < deadline, "the owner never accepted the connection"
        time.sleep(0.01)


def rows_of(rng, n_rows):
    return [rng.integers(1, 30000, rng.integers(1, 60)).astype(np.int64) for _ in range(n_rows)]


def test_the_wire_round_trips_and_refuses_frames_that_disagree():
    rng = np.random.default_rng(0)
    requests = [rows_of(rng, k) for k in (1, 3, 2)]
    clients = ["10.0.0.7", "", "клиент"]
    now = 100.0
    sent = [
        Request(rows, never_cancelled, deadline, never_cancelled, client)
        for rows, deadline, client in zip(requests, [100.5, None, 102.0], clients, strict=True)
    ]
    frames = encode_submit([7, 8, 9], sent, now)
    assert bytes(frames[0]) == SUBMIT
    bound = []

    def bind(rid):
        bound.append(rid)
        return (lambda outcome: None), (lambda: rid == 8)

    decoded = decode_submit(frames, 50.0, bind)  # the receiver's clock: deadlines move with it
    assert bound == [7, 8, 9]
    assert [d.deadline for d in decoded] == [50.5, None, 52.0]
    assert [d.client for d in decoded] == clients
    assert [d.is_cancelled() for d in decoded] == [False, True, False]
    bad_names = list(frames)
    bad_names[7] = b"\xff" * len(bytes(frames[7]))
    with pytest.raises(WireError, match="not UTF-8"):
        decode_submit(bad_names, now, bind)
    bad_names[6] = np.asarray([1, 1, 1], np.int32).tobytes()
    with pytest.raises(WireError, match="client names' lengths"):
        decode_submit(bad_names, now, bind)
    for d, rows in zip(decoded, requests, strict=True):
        assert len(d.rows) == len(rows)
        for got, sent_row in zip(d.rows, rows, strict=True):
            assert got.dtype == np.int64 and np.array_equal(got, sent_row)
    torn = list(frames)
    torn[4] = np.asarray([1, 2], np.int32).tobytes()  # two row lengths for six rows
    with pytest.raises(WireError, match="lengths"):
        decode_submit(torn, now, bind)
    torn[4] = b"abc"  # not a whole number of int32
    with pytest.raises(WireError, match="whole number"):
        decode_submit(torn, now, bind)

    outputs = rng.random((3, WIDTH), dtype=np.float32)
    answer_frames = encode_answers(
        [
            (8, ServeError(Reason.TIMEOUT, "late")),
            (7, Answer(outputs, np.asarray([4, 5, 6], np.int32), 0.25, 0.125)),
        ],
        WIDTH,
    )
    (rid, answer), (failed_id, error) = decode_answers(answer_frames, WIDTH)
    assert rid == 7 and isinstance(answer, Answer) and np.array_equal(answer.outputs, outputs)
    assert answer.num_tokens.tolist() == [4, 5, 6]
    assert (answer.queue_s, answer.inference_s) == (0.25, 0.125)
    with pytest.raises(WireError, match="times for 1 answered"):
        decode_answers([*answer_frames[:6], answer_frames[6][:8]], WIDTH)
    assert failed_id == 8 and isinstance(error, ServeError) and error.reason is Reason.TIMEOUT
    assert str(error) == "late"
    with pytest.raises(WireError, match="width"):
        decode_answers(answer_frames, WIDTH + 1)
    # a message of failures only (no outputs at all), and an empty one
    only_failed = encode_answers([(9, ServeError(Reason.CANCELLED, "gone"))], WIDTH)
    ((rid, error),) = decode_answers(only_failed, WIDTH)
    assert rid == 9 and error.reason is Reason.CANCELLED
    assert decode_submit(encode_submit([], [], now), now, bind) == []


def test_every_request_gets_its_own_rows_outputs_once(endpoint):
    owner = fake_owner(endpoint)
    owner.start()
    client = remote(endpoint)
    try:
        rng = np.random.default_rng(1)
        sent = {k: rows_of(rng, int(rng.integers(1, 5))) for k in range(300)}
        answers = Answers()
        for k, rows in sent.items():
            submit(client, rows, answers.respond_for(k), timeout_s=30.0)
        answers.wait(len(sent))
        for k, rows in sent.items():
            outcome = answers.outcomes[k]
            assert isinstance(outcome, Answer), outcome
            want = np.asarray([[r.sum(), len(r)] for r in rows], np.float32)
            assert np.array_equal(outcome.outputs[:, :2], want)
            assert outcome.num_tokens.tolist() == [len(r) for r in rows]
    finally:
        client.stop()
        owner.stop(5.0)


def test_a_cancelled_request_is_dropped_before_its_forward_and_a_deadline_holds(endpoint):
    gate = threading.Event()
    owner = fake_owner(endpoint, gate)
    owner.start()
    client = remote(endpoint, cancel_poll_s=0.01)
    try:
        answers = Answers()
        submit(client, [np.arange(1, 10)], answers.respond_for(0))  # holds the engine
        engine = owner.owner.scheduler.engine
        assert engine.wait_for_calls(1)
        gone = threading.Event()
        submit(client, [np.arange(1, 40)], answers.respond_for(1), is_cancelled=gone.is_set)
        submit(client, [np.arange(1, 50)], answers.respond_for(2), timeout_s=0.0)
        submit(client, [np.arange(1, 20)], answers.respond_for(3))
        gone.set()
        time.sleep(0.2)  # the client's poll (10 ms) tells the owner before the gate opens
        gate.set()
        answers.wait(4)
        assert isinstance(answers.outcomes[0], Answer) and isinstance(answers.outcomes[3], Answer)
        assert answers.outcomes[1].reason is Reason.CANCELLED
        assert answers.outcomes[2].reason is Reason.TIMEOUT
        assert all(length != 64 for _, length in engine.calls), "a dropped row ran"
    finally:
        client.stop()
        owner.stop(5.0)


def start_owner_process(endpoint: str, blocked: bool, overlap: bool = False) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-m", "testkit.owner_process", endpoint]
        + (["--blocked"] if blocked else [])
        + (["--overlap"] if overlap else []),
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def test_no_owner_then_a_killed_owner_then_a_new_one(endpoint):
    refused = []
    client = RemoteOwner(endpoint, WIDTH, wait_s=WAIT_S, refused=refused.append)
    starting = threading.Thread(target=client.start)  # as a front's load waits for its owner
    starting.start()
    answers = Answers()
    owner = None
    try:
        submit(client, [np.arange(1, 5)], answers.respond_for(0))
        answers.wait(1)
        assert answers.outcomes[0].reason is Reason.OWNER_LOST  # at once: no owner runs

        owner = start_owner_process(endpoint, blocked=True)
        starting.join(WAIT_S)
        assert client.ready()
        for k in range(1, 21):
            submit(client, [np.arange(1, 5 + k)], answers.respond_for(k))
        time.sleep(0.3)
        owner.kill()
        owner.wait()
        answers.wait(21)
        assert {answers.outcomes[k].reason for k in range(1, 21)} == {Reason.OWNER_LOST}
        # the owner never counted these: the front's handle did, each once
        assert refused == [Reason.OWNER_LOST] * 21

        owner = start_owner_process(endpoint, blocked=False)
        wait_connected(client)
        submit(client, [np.arange(1, 9)], answers.respond_for(21))
        answers.wait(22)
        assert isinstance(answers.outcomes[21], Answer)
        assert answers.outcomes[21].outputs[0, 0] == np.arange(1, 9).sum()
    finally:
        client.stop()
        if owner is not None:
            owner.terminate()
            owner.wait(10)


def gated(endpoint, **kw) -> tuple[threading.Event, QueueOwner, RemoteOwner]:
    """An owner whose engine waits at a gate, and a front's handle on it, both started."""
    gate = threading.Event()
    owner = fake_owner(endpoint, gate, **kw)
    owner.start()
    refused: list[Reason] = []
    client = remote(endpoint, refused=refused.append)
    client.refused_here = refused
    return gate, owner, client


def test_a_silent_fronts_queued_rows_are_dropped_and_it_reads_why_on_resuming(endpoint):
    gate, owner, client = gated(endpoint, front_silent_s=0.3)
    try:
        answers = Answers()
        submit(client, [np.arange(1, 9)], answers.respond_for(0))  # holds the engine
        assert owner.owner.scheduler.engine.wait_for_calls(1)
        submit(client, [np.arange(1, 60)], answers.respond_for(1))
        time.sleep(0.2)
        owner._last_heard[client.identity] = -1e9  # as if the front had been stopped for long
        deadline = time.monotonic() + WAIT_S  # the I/O thread marks its tickets a moment later
        while not all(t.cancelled for t in owner._live.get(client.identity, {}).values()):
            assert time.monotonic() < deadline, "the silent front's tickets were never marked"
            time.sleep(0.01)
        gate.set()
        answers.wait(2)
        assert isinstance(answers.outcomes[0], Answer)
        assert answers.outcomes[1].reason is Reason.OWNER_LOST
        assert "stalled" in str(answers.outcomes[1])
        # the owner counted it (cancelled): the front must not count it again
        assert client.refused_here == []
        assert all(length != 64 for _, length in owner.owner.scheduler.engine.calls)
    finally:
        client.stop()
        owner.stop(5.0)


def test_a_front_waiting_for_its_owner_fails_at_once_with_the_owners_reason(endpoint):
    from python_backend.transport.queue_owner import clear_failure, failure_file, record_failure

    def front(wait_s: float) -> RemoteOwner:
        return RemoteOwner(endpoint, WIDTH, wait_s=wait_s, failure_file=failure_file(endpoint))

    with pytest.raises(RuntimeError, match="did not accept a connection"):
        front(0.3).start()
    record_failure(endpoint, "EngineError: out of memory loading the plan")
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to start: EngineError: out of memory"):
        front(60.0).start()
    assert time.monotonic() - started < 5
    clear_failure(endpoint)  # as an owner that starts does
    owner = fake_owner(endpoint)
    owner.start()
    client = front(WAIT_S)
    try:
        client.start()
        assert client.ready()
    finally:
        client.stop()
        owner.stop(5.0)


def test_the_client_name_crosses_to_the_owners_queue(endpoint):
    gate, owner, client = gated(endpoint)
    try:
        answers = Answers()
        submit(client, [np.arange(1, 9)], answers.respond_for(0), client_name="a")  # holds it
        scheduler = owner.owner.scheduler
        assert scheduler.engine.wait_for_calls(1)
        submit(client, [np.arange(1, 9)] * 3, answers.respond_for(1), client_name="b")
        submit(client, [np.arange(1, 9)], answers.respond_for(2), client_name="a")
        deadline = time.monotonic() + WAIT_S
        while scheduler.queued_rows < 4:
            assert time.monotonic() < deadline, "the requests never reached the owner's queue"
            time.sleep(0.01)
        queue = scheduler._queue.lines[0]  # the first class's
        assert (queue.rows_of("a"), queue.rows_of("b"), queue.clients) == (1, 3, 2)
        gate.set()
        answers.wait(3)
        assert all(isinstance(answers.outcomes[k], Answer) for k in range(3))
    finally:
        client.stop()
        owner.stop(5.0)


def test_the_socket_folder_and_its_parent_are_this_users_own(tmp_path):
    """The predictable base folder is checked like the server's own folder inside it: made
    private when it is this user's, refused when it is a link or another user's (they could
    swap the folder inside it and receive the fronts' rows)."""
    import stat

    base = tmp_path / "base"
    base.mkdir(mode=0o777)
    base.chmod(0o777)
    endpoint = owner_endpoint(str(base / "123"), "m", 0)
    assert endpoint == f"ipc://{base / '123' / 'm-0.sock'}"
    for folder in (base, base / "123"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "linked").symlink_to(elsewhere)
    with pytest.raises(RuntimeError, match="linked is a link"):
        owner_endpoint(str(tmp_path / "linked" / "123"), "m", 0)
    if os.getuid() == 0:  # only root can give a folder away
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o777)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(RuntimeError, match="owned by uid 65534"):
            owner_endpoint(str(foreign / "123"), "m", 0)


def test_a_request_whose_rows_no_forward_can_run_fails_alone(endpoint):
    """The owner checks again what its fronts checked and what would fail a whole forward: a
    row longer than the engine takes fails its request at planning (TOO_LONG, naming the row);
    an id outside the vocabulary is refused before the engine sees it, and the split that
    follows leaves that row failing alone. The requests beside them are answered."""
    owner = fake_owner(endpoint, vocab_size=30000)
    longest = owner.owner.scheduler.layout.longest_row
    owner.start()
    client = remote(endpoint)
    try:
        fine = [np.arange(1, 9, dtype=np.int64)]
        sent = {
            "fine": fine,
            "too long": [fine[0], np.ones(longest + 1, np.int64)],
            "outside": [np.asarray([5, 30000], np.int64)],
            "negative": [np.asarray([-1], np.int64)],
            "also fine": fine * 3,
        }
        answers = Answers()
        for k, rows in sent.items():
            submit(client, rows, answers.respond_for(k), timeout_s=30.0)
        answers.wait(len(sent))
        for k in ("fine", "also fine"):
            assert isinstance(answers.outcomes[k], Answer), answers.outcomes[k]
        error = answers.outcomes["too long"]
        assert isinstance(error, ServeError) and error.reason is Reason.TOO_LONG, error
        assert str(error) == f"row 1 has {longest + 1} tokens; the engine takes at most {longest}"
        for k in ("outside", "negative"):
            error = answers.outcomes[k]
            assert isinstance(error, ServeError) and error.reason is Reason.FORWARD_FAILED, error
            assert "failed even alone" in str(error)
            assert "outside the vocabulary [0, 30000)" in str(error)
    finally:
        client.stop()
        owner.stop()
