"""The queue owner: the one process per GPU that sees every row, fed by many front processes.

The fronts do the work that scales with requests (decoding, tokenizing, answering Triton); the
owner does what must see every row: the queue, the planner, the engine (a ``LocalOwner``, which
``QueueOwner`` serves to the fronts: each front's ``RemoteOwner`` is its handle on it). Between
them, ZeroMQ over a Unix socket: the owner binds a ROUTER, each front connects a DEALER, and each
message is a batch (``transport.wire``): everything a front had pending, every answer ready for one
front.

One I/O thread owns the socket (ZeroMQ sockets are not shared between threads). It decodes each
SUBMIT into requests for the local owner; each answer comes back to it through a queue and an
eventfd (the owner answers on its scheduler thread), and it sends whatever has accumulated for a
front as one message. A request's cancellation is a set lookup here (the front asks Triton and
sends CANCEL), so the scheduler's checks before each forward cost no message.

A front that dies or stops (SIGSTOP) sends nothing: after ``FRONT_SILENT_S`` without a message
from it (fronts send a heartbeat when idle), its queued requests are dropped before they cost a
forward, answered as cancelled; whatever reaches a front that is gone is dropped by ZeroMQ
(``EHOSTUNREACH``), and a front that resumes reads its answers.
"""

from __future__ import annotations

import collections
import contextlib
import math
import os
import stat
import threading
import time
from collections.abc import Callable
from functools import partial

import zmq

from python_backend.common.contract import Reason, ServeError
from python_backend.scheduling.owners import Owner
from python_backend.scheduling.records import Outcome, Respond
from python_backend.transport.wire import (
    CANCEL,
    HEARTBEAT,
    SUBMIT,
    Frame,
    Wakeup,
    WireError,
    decode_cancel,
    decode_submit,
    encode_answers,
    received,
)

FRONT_SILENT_S = 3.0  # a front this long without a message is taken as gone (heartbeat: 0.5 s)
POLL_S = 0.25  # the I/O thread's longest sleep: it checks the fronts' silence this often


class _Ticket:
    """A queued request's cancellation, as the scheduler asks it before each forward: marked by
    the I/O thread, read by the scheduler thread (one attribute: no lock needed)."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def is_cancelled(self) -> bool:
        return self.cancelled


class QueueOwner:
    """Serves ``owner`` to the fronts connecting at ``endpoint`` (``ipc://PATH``). ``owner``
    answers through ``respond`` only (a deque append): it needs no responder thread."""

    def __init__(
        self,
        owner: Owner,
        endpoint: str,
        output_width: int,
        clock: Callable[[], float] = time.monotonic,
        log: Callable[[str], None] = lambda message: None,
        front_silent_s: float = FRONT_SILENT_S,
    ) -> None:
        self.owner = owner
        self.front_silent_s = front_silent_s
        self.endpoint = endpoint
        self.output_width = output_width
        self.clock = clock
        self.log = log
        self._context: zmq.Context = zmq.Context.instance()
        self._ready: collections.deque[tuple[bytes, int, Outcome]] = collections.deque()
        self._wake = Wakeup()  # the scheduler's answers are ready: one wake-up per step
        # every request submitted and not yet answered, by front and id: its ticket is marked
        # when its front sends CANCEL or falls silent (a late CANCEL finds nothing to mark)
        self._live: dict[bytes, dict[int, _Ticket]] = {}
        self._last_heard: dict[bytes, float] = {}
        self._silence_checked = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bound = threading.Event()
        self._bind_error: Exception | None = None

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self, timeout_s: float = 10.0) -> None:
        """Starts the owner and the I/O thread; returns once the socket is bound."""
        self.owner.start()
        self._thread = threading.Thread(target=self._serve, name="queue-owner-io", daemon=True)
        self._thread.start()
        if not self._bound.wait(timeout_s) or self._bind_error is not None:
            raise RuntimeError(
                f"the queue owner could not bind {self.endpoint}: {self._bind_error}"
            )

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finishes what is queued (the owner's drain), sends the last answers, closes (once)."""
        if self._stop.is_set():
            return
        self.owner.stop(timeout_s)
        self._stop.set()
        self._wake.force()
        if self._thread is not None:
            self._thread.join(5.0)
        self._wake.close()

    # -- what the owner calls ---------------------------------------------------------------------

    def _respond(self, front: bytes, request_id: int, outcome: Outcome) -> None:
        self._ready.append((front, request_id, outcome))
        self._wake.signal()

    def _mark_silent_fronts(self) -> None:
        """Marks the tickets of every front silent for ``front_silent_s`` (checked by the I/O
        thread a few times a second, not by the scheduler for each request)."""
        now = self.clock()
        if now - self._silence_checked < min(POLL_S, self.front_silent_s / 2):
            return
        self._silence_checked = now
        for front, tickets in self._live.items():
            if now - self._last_heard.get(front, -math.inf) > self.front_silent_s:
                for ticket in tickets.values():
                    ticket.cancelled = True

    # -- the I/O thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        try:
            socket = self._context.socket(zmq.ROUTER)
            socket.setsockopt(zmq.ROUTER_MANDATORY, 1)  # a send to a gone front raises
            socket.setsockopt(zmq.SNDHWM, 0)  # answers are bounded by the queue's own bound
            socket.setsockopt(zmq.RCVHWM, 0)
            socket.setsockopt(zmq.LINGER, 0)
            socket.bind(self.endpoint)
        except Exception as err:
            self._bind_error = err
            self._bound.set()
            return
        self._bound.set()
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(self._wake.fd, zmq.POLLIN)
        try:
            while True:
                events = dict(poller.poll(round(POLL_S * 1000)))
                if socket in events:
                    try:
                        self._receive_all(socket)
                    except Exception as err:  # never end the thread: every front depends on it
                        self.log(f"queue owner: receiving failed: {err!r}")
                if self._wake.fd in events:
                    self._wake.take()
                self._mark_silent_fronts()
                self._send_ready(socket)
                if self._stop.is_set() and not self._ready:
                    return
        finally:
            socket.close(linger=0)

    def _receive_all(self, socket: zmq.Socket) -> None:
        for frames, body in received(socket, skip=1):
            front, kind = frames[0].bytes, frames[1].bytes if len(frames) > 1 else b""
            self._last_heard[front] = self.clock()
            try:
                if kind == SUBMIT:
                    self._submit(front, body)
                elif kind == CANCEL:
                    tickets = self._live.get(front, {})
                    for rid in decode_cancel(body):
                        if rid in tickets:
                            tickets[rid].cancelled = True
                elif kind != HEARTBEAT:
                    raise WireError(f"unknown message kind {kind[:32]!r}")
            except WireError as err:  # a front of another version: say so, drop the message
                self.log(f"queue owner: a message from a front did not decode: {err}")

    def _submit(self, front: bytes, body: list[Frame]) -> None:
        tickets = self._live.setdefault(front, {})

        def bind(rid: int) -> tuple[Respond, Callable[[], bool]]:
            ticket = tickets[rid] = _Ticket()
            return partial(self._respond, front, rid), ticket.is_cancelled

        for request in decode_submit(body, self.clock(), bind):
            self.owner.submit(request)

    def _send_ready(self, socket: zmq.Socket) -> None:
        if not self._ready:
            return
        by_front: dict[bytes, list[tuple[int, Outcome]]] = {}
        while self._ready:
            front, rid, outcome = self._ready.popleft()
            tickets = self._live.get(front)
            if tickets is not None:
                tickets.pop(rid, None)
                if not tickets:
                    del self._live[front]
            by_front.setdefault(front, []).append((rid, outcome))
        for front, outcomes in by_front.items():
            try:
                frames = encode_answers(outcomes, self.output_width)
            except Exception as err:  # outputs of the wrong shape: a bug, but answer every one
                self.log(f"queue owner: answers did not encode: {err!r}")
                error = ServeError(Reason.INTERNAL, "the server could not send this answer")
                everyone = [(rid, o if isinstance(o, ServeError) else error) for rid, o in outcomes]
                frames = encode_answers(everyone, self.output_width)
            try:
                socket.send_multipart([front, *frames], zmq.NOBLOCK, copy=False)
            except zmq.ZMQError as err:  # the front is gone: nobody is left to read them
                if err.errno != zmq.EHOSTUNREACH:  # not seen: the loop goes on for the others
                    self.log(f"queue owner: answers to a front could not be sent: {err}")
                self._last_heard.pop(front, None)
                self._live.pop(front, None)


def owner_endpoint(directory: str, model_name: str, device_id: int) -> str:
    """The Unix socket of ``model_name``'s queue owner on GPU ``device_id`` (0 on CPU), in
    ``directory``, which is made private to this user with its parent (only its processes may
    submit, or swap the folder for another)."""
    private_folder(os.path.dirname(os.path.abspath(directory)))
    private_folder(directory)
    return f"ipc://{os.path.join(directory, f'{model_name}-{device_id}.sock')}"


def private_folder(folder: str) -> None:
    """``folder`` made, or checked, as this user's own: a real folder (not a link), owned by this
    user, mode 0700. A parent that another user made first, or could write, would let them put
    a folder of their own where the fronts send their rows; RuntimeError names it."""
    os.makedirs(folder, mode=0o700, exist_ok=True)
    info = os.lstat(folder)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        whose = "a link" if stat.S_ISLNK(info.st_mode) else f"owned by uid {info.st_uid}"
        raise RuntimeError(
            f"{folder} is {whose}, not a folder of this user's own: set PLANNER_SOCKET_DIR to "
            "another folder"
        )
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(folder, 0o700)


def failure_file(endpoint: str) -> str:
    """Where an owner that failed to start leaves its reason, beside its socket, so that its
    fronts, waiting for it, fail at once with that reason instead of at their timeout."""
    return endpoint.removeprefix("ipc://") + ".failed"


def record_failure(endpoint: str, reason: str) -> None:
    with contextlib.suppress(OSError), open(failure_file(endpoint), "w") as out:
        out.write(reason)


def clear_failure(endpoint: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(failure_file(endpoint))
