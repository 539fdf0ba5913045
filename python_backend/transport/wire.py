"""The messages between the fronts and a queue owner: plain data, in batches, as numpy buffers.

A message is one ZeroMQ multipart message: a kind frame, then numpy arrays sent as raw frames
(each a column: no Python object per row crosses, and nothing is pickled). One message carries
every request a front had pending, or every answer the owner had ready for one front, so the
count of messages falls as load rises.

- ``SUBMIT`` (front -> owner): request ids, rows per request, the seconds each may still wait
  (NaN: no deadline), every row's length, every row's token ids end to end, the clients' names,
  and each request's class.
- ``CANCEL`` (front -> owner): the ids of requests whose clients went away.
- ``HEARTBEAT`` (front -> owner): nothing; a front that sent nothing else for a while.
- ``ANSWERS`` (owner -> front): the ids answered with outputs, their rows, the outputs [rows, D]
  end to end and each row's token count; then the failures, as JSON (id, reason, message):
  they are few and carry text.

The frames are decoded with their dtypes and checked for agreement (counts, lengths): a front
and an owner are one deployment's processes, but a torn or mismatched message must fail loudly,
never misassign a row.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence

import numpy as np
import zmq

from python_backend.common.contract import Reason, ServeError
from python_backend.scheduling.records import Answer, Outcome, Request, Respond

SUBMIT, CANCEL, ANSWERS = b"submit", b"cancel", b"answers"
HEARTBEAT = b"alive"  # a front with nothing to send says it still runs
TOKEN_DTYPE = np.int32  # vocabularies stay far below 2**31; the engines take int64
NO_DEADLINE = math.nan


Frame = bytes | memoryview  # what ZeroMQ sends and receives: bytes, or a view of raw bytes


def _raw(values: np.ndarray) -> Frame:
    """A column as a frame: its bytes, not copied (an empty one is b"")."""
    if values.size == 0:
        return b""
    return np.ascontiguousarray(values).reshape(-1).data.cast("B")


class WireError(ValueError):
    """A message that does not decode: its frames disagree or are of the wrong size."""


def _column(frame: Frame, dtype: type, what: str) -> np.ndarray:
    size = np.dtype(dtype).itemsize
    if len(frame) % size:
        raise WireError(f"{what}: {len(frame)} bytes is not a whole number of {dtype.__name__}")
    return np.frombuffer(frame, dtype=dtype)


def _spans(counts: np.ndarray) -> list[tuple[int, int]]:
    """(start, end) of each request's rows in the message's rows, from its row counts."""
    ends = np.cumsum(counts).tolist()
    return list(zip([0, *ends][: len(ends)], ends, strict=True))


def received(socket: zmq.Socket, skip: int = 0) -> Iterator[tuple[list[zmq.Frame], list[Frame]]]:
    """Every message waiting on ``socket``, without blocking: its frames, and the bytes of each
    after the first ``skip`` (the ROUTER's peer identity) as views, not copies."""
    while True:
        try:
            frames = socket.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        yield frames, [f.buffer for f in frames[skip:]]


class Wakeup:
    """Wakes an I/O thread polling ZeroMQ sockets when another thread has queued work for it:
    an eventfd (the poller takes its descriptor), written at most once until the I/O thread
    takes the wake-up, so a burst of work costs one write and one wake."""

    def __init__(self) -> None:
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self._armed = False  # a wake-up is on its way: work queued meanwhile rides on it

    def signal(self) -> None:
        """After queuing work: wakes the I/O thread unless a wake-up is already pending."""
        if not self._armed:
            self._armed = True
            os.eventfd_write(self.fd, 1)

    def force(self) -> None:
        """Wakes the I/O thread whatever is pending (to stop it)."""
        os.eventfd_write(self.fd, 1)

    def take(self) -> None:
        """The I/O thread, woken, before it drains the queued work. Read, then clear: work
        queued after the clear signals again and wakes the next poll; work queued before it is
        in what is drained now."""
        with contextlib.suppress(BlockingIOError):
            os.eventfd_read(self.fd)
        self._armed = False

    def close(self) -> None:
        os.close(self.fd)


def encode_submit(
    request_ids: Sequence[int], requests: Sequence[Request], now: float
) -> list[Frame]:
    """One SUBMIT message for these requests: each one's rows, client and the seconds its
    deadline leaves it at ``now`` (the sender's monotonic clock)."""
    names = [r.client.encode("utf-8") for r in requests]
    lengths = [len(row) for r in requests for row in r.rows]
    ids = (
        np.concatenate([row for r in requests for row in r.rows]).astype(TOKEN_DTYPE, copy=False)
        if lengths
        else np.empty(0, TOKEN_DTYPE)
    )
    timeouts = [NO_DEADLINE if r.deadline is None else r.deadline - now for r in requests]
    return [
        SUBMIT,
        _raw(np.asarray(request_ids, np.int64)),
        _raw(np.fromiter((len(r.rows) for r in requests), np.int32, len(requests))),
        _raw(np.asarray(timeouts, np.float64)),
        _raw(np.asarray(lengths, np.int32)),
        _raw(ids),
        _raw(np.fromiter(map(len, names), np.int32, len(names))),
        b"".join(names),
        _raw(np.fromiter((r.priority for r in requests), np.int32, len(requests))),
    ]


Bind = Callable[[int], tuple[Respond, Callable[[], bool]]]


def decode_submit(frames: Sequence[Frame], now: float, bind: Bind) -> list[Request]:
    """The requests of a SUBMIT message, each with its deadline on the receiver's clock
    (``now`` plus the seconds it had left) and the answer and cancellation ``bind(request_id)``
    gives it."""
    if len(frames) != 9 or bytes(frames[0]) != SUBMIT:
        raise WireError(f"a submit message has 9 frames, this one {len(frames)}")
    request_ids = _column(frames[1], np.int64, "request ids")
    rows_per = _column(frames[2], np.int32, "rows per request")
    timeouts = _column(frames[3], np.float64, "timeouts")
    lengths = _column(frames[4], np.int32, "row lengths")
    tokens = _column(frames[5], TOKEN_DTYPE, "token ids")
    name_lengths = _column(frames[6], np.int32, "client name lengths")
    names = bytes(frames[7])
    priorities = _column(frames[8], np.int32, "classes")
    if not (
        len(request_ids) == len(rows_per) == len(timeouts) == len(name_lengths) == len(priorities)
    ):
        raise WireError(
            "request ids, rows per request, timeouts, clients and classes differ in count"
        )
    if (name_lengths < 0).any() or int(name_lengths.sum()) != len(names):
        raise WireError("the client names' lengths do not cover their bytes")
    try:
        clients = [names[a:b].decode("utf-8") for a, b in _spans(name_lengths)]
    except UnicodeDecodeError:
        raise WireError("a client name is not UTF-8") from None
    if int(rows_per.sum()) != len(lengths) or int(lengths.sum()) != len(tokens):
        raise WireError("the rows' lengths do not cover the token ids")
    if (rows_per < 1).any() or (lengths < 1).any():
        raise WireError("a request with no rows or a row with no tokens")
    wide = tokens.astype(np.int64)  # one conversion for the whole message
    rows = np.split(wide, np.cumsum(lengths[:-1])) if len(lengths) else []
    requests = []
    for request_id, (a, b), timeout, client, priority in zip(
        request_ids.tolist(),
        _spans(rows_per),
        timeouts.tolist(),
        clients,
        priorities.tolist(),
        strict=True,
    ):
        respond, is_cancelled = bind(request_id)
        deadline = None if math.isnan(timeout) else now + timeout
        requests.append(Request(rows[a:b], respond, deadline, is_cancelled, client, priority))
    return requests


def encode_cancel(request_ids: Sequence[int]) -> list[Frame]:
    return [CANCEL, _raw(np.asarray(request_ids, np.int64))]


def decode_cancel(frames: Sequence[Frame]) -> list[int]:
    if len(frames) != 2 or bytes(frames[0]) != CANCEL:
        raise WireError(f"a cancel message has 2 frames, this one {len(frames)}")
    return _column(frames[1], np.int64, "request ids").tolist()


def encode_answers(outcomes: Sequence[tuple[int, Outcome]], width: int) -> list[Frame]:
    """One ANSWERS message for (request id, outcome) pairs; ``width`` is D, the outputs'
    second dimension."""
    answered = [(rid, o) for rid, o in outcomes if isinstance(o, Answer)]
    errors = [[rid, o.reason.value, str(o)] for rid, o in outcomes if isinstance(o, ServeError)]
    outputs = (
        np.concatenate([a.outputs for _, a in answered]).astype(np.float32, copy=False)
        if answered
        else np.empty((0, width), np.float32)
    )
    num_tokens = (
        np.concatenate([a.num_tokens for _, a in answered]).astype(np.int32, copy=False)
        if answered
        else np.empty(0, np.int32)
    )
    times = np.asarray([(a.queue_s, a.inference_s) for _, a in answered], np.float64)
    return [
        ANSWERS,
        _raw(np.asarray([rid for rid, _ in answered], np.int64)),
        _raw(np.fromiter((len(a.outputs) for _, a in answered), np.int32, len(answered))),
        _raw(outputs),
        _raw(num_tokens),
        json.dumps(errors).encode(),
        _raw(times.reshape(-1)),
    ]


def decode_answers(frames: Sequence[Frame], width: int) -> list[tuple[int, Outcome]]:
    """(request id, outcome) for each request an ANSWERS message answers: those answered with
    outputs first, then those that failed."""
    if len(frames) != 7 or bytes(frames[0]) != ANSWERS:
        raise WireError(f"an answers message has 7 frames, this one {len(frames)}")
    request_ids = _column(frames[1], np.int64, "request ids")
    rows_per = _column(frames[2], np.int32, "rows per request")
    outputs = _column(frames[3], np.float32, "outputs")
    num_tokens = _column(frames[4], np.int32, "token counts")
    total = int(rows_per.sum())
    if len(request_ids) != len(rows_per) or len(num_tokens) != total:
        raise WireError("answered ids, rows and token counts differ in count")
    if len(outputs) != total * width:
        raise WireError(f"{len(outputs)} output values for {total} rows of width {width}")
    times = _column(frames[6], np.float64, "times")
    if len(times) != 2 * len(request_ids):
        raise WireError(f"{len(times)} times for {len(request_ids)} answered requests")
    times = times.reshape(-1, 2)
    outputs = outputs.reshape(total, width)
    outcomes: list[tuple[int, Outcome]] = [
        (request_id, Answer(outputs[a:b], num_tokens[a:b], float(t[0]), float(t[1])))
        for request_id, (a, b), t in zip(request_ids.tolist(), _spans(rows_per), times, strict=True)
    ]
    for request_id, reason, message in json.loads(bytes(frames[5])):
        outcomes.append((int(request_id), ServeError(Reason(reason), message)))
    return outcomes
