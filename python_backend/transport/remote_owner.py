"""The remote owner: a front's handle on its queue owner, in another process across a socket.

It takes what a ``LocalOwner`` takes (``scheduling.owners``): ``submit`` a request, whose
``respond`` is called once with its answer; ``start``, ``ready``, ``stop``. Triton's ``execute``
calls ``submit`` (it only appends and wakes the I/O thread); the I/O thread
owns the DEALER socket: it sends everything pending as one message, reads answers and calls each
request's ``respond`` (which sends its Triton response) exactly once. The work of asking Triton
whether a client went away is here too: each request in flight is asked once it has waited
``cancel_poll_s``, and again every ``cancel_poll_s`` after (each question is a message to Triton,
so a request answered sooner costs none); a cancelled one is told to the owner, which drops its
rows before their forward.

The owner can die or restart. The socket is ``immediate`` (nothing is queued for an owner that is
not connected) and its monitor reports the disconnection at once: every request in flight is
then answered ``owner_lost`` (503, retry), a request submitted while no owner runs is answered so
at once, and ZeroMQ reconnects by itself when an owner binds again. Those refusals are this
handle's own: it counts them (``refused``); every other one was counted by the owner.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import zmq
from zmq.utils.monitor import recv_monitor_message

from python_backend.common.contract import Reason, ServeError
from python_backend.scheduling.records import Outcome, Request
from python_backend.transport.wire import (
    ANSWERS,
    HEARTBEAT,
    Wakeup,
    WireError,
    decode_answers,
    encode_cancel,
    encode_submit,
    received,
)

HEARTBEAT_S = 0.5  # the owner takes a front silent for FRONT_SILENT_S (3 s) as gone
# how long a request waits before it is first asked whether its client left, and then between
# questions: at 64 requests in flight and 20 ms, the questions alone took 2.8 ms of a front's CPU
# per request served by the ONNX Runtime engine on the CPU (docs/ARCHITECTURE.md)
CANCEL_POLL_S = 0.1
OWNER_WAIT_S = 600.0  # ``start`` waits this long for the owner (a TensorRT engine's load)


@dataclass(slots=True)
class _InFlight:
    request: Request
    ask_at: float = 0.0  # when to ask is_cancelled next (monotonic)
    cancel_sent: bool = False


class RemoteOwner:
    """The queue owner at ``endpoint`` (``ipc://PATH``), whose outputs are ``output_width`` wide."""

    def __init__(
        self,
        endpoint: str,
        output_width: int,
        cancel_poll_s: float = CANCEL_POLL_S,
        log: Callable[[str], None] = lambda message: None,
        tick: Callable[[], None] = lambda: None,
        refused: Callable[[Reason], None] = lambda reason: None,
        wait_s: float = OWNER_WAIT_S,
        failure_file: str | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.output_width = output_width
        self.cancel_poll_s = cancel_poll_s
        self.log = log
        self.tick = tick  # called by the I/O thread at each wake-up (a front's metrics flush)
        self.refused = refused  # counts a refusal this handle made (the owner never saw it)
        self.wait_s = wait_s
        self.failure_file = failure_file  # where an owner that failed to start says why
        self.identity = uuid.uuid4().bytes  # a new front process is a new front to the owner
        self._ids = itertools.count()
        # (request id, its record) per request not yet sent
        self._outgoing: deque[tuple[int, _InFlight]] = deque()
        self._in_flight: dict[int, _InFlight] = {}
        self._wake = Wakeup()  # requests were submitted: one wake-up for all of them
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Connects; returns once the owner is connected (a front may start before its owner).
        Raises RuntimeError, stopped, after ``wait_s``, or at once when the owner left the reason
        it failed to start in ``failure_file``."""
        self._thread = threading.Thread(target=self._serve, name="owner-client-io", daemon=True)
        self._thread.start()
        try:
            self._wait_for_owner()
        except RuntimeError:
            self.stop()
            raise

    def _wait_for_owner(self) -> None:
        deadline = time.monotonic() + self.wait_s
        while not self._connected.wait(min(0.25, max(0.0, deadline - time.monotonic()))):
            if self.failure_file is not None:
                try:
                    with open(self.failure_file) as reason:
                        raise RuntimeError(f"the queue owner failed to start: {reason.read()}")
                except FileNotFoundError:
                    pass
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"the queue owner did not accept a connection at {self.endpoint} within "
                    f"{self.wait_s:.0f} s: is it in the repository and loaded?"
                )

    def ready(self) -> bool:
        """Whether the owner is connected now."""
        return self._connected.is_set()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stops; whatever is still in flight is answered as a shutdown."""
        self._stop.set()
        self._wake.force()
        if self._thread is not None:
            self._thread.join(timeout_s)
        self._wake.close()

    def submit(self, request: Request) -> None:
        """Sends a request to the owner (soon, with whatever else is pending); its ``respond``
        is called once, from the I/O thread, with its Answer or a ServeError."""
        entry = _InFlight(request)
        if self._stop.is_set():
            self._answer(entry, ServeError(Reason.SHUTDOWN, "the model is stopping; retry"))
            return
        self._outgoing.append((next(self._ids), entry))
        self._wake.signal()

    # -- the I/O thread ---------------------------------------------------------------------------

    def _serve(self) -> None:
        context: zmq.Context = zmq.Context.instance()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.IDENTITY, self.identity)
        socket.setsockopt(zmq.IMMEDIATE, 1)  # no queue for an owner that is not there
        socket.setsockopt(zmq.SNDHWM, 0)
        socket.setsockopt(zmq.RCVHWM, 0)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RECONNECT_IVL, 100)
        socket.setsockopt(zmq.RECONNECT_IVL_MAX, 250)
        monitor = socket.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        socket.connect(self.endpoint)
        poller = zmq.Poller()
        for source in (socket, monitor, self._wake.fd):
            poller.register(source, zmq.POLLIN)
        last_sent = last_polled = time.monotonic()
        try:
            while not self._stop.is_set():
                events = dict(poller.poll(round(min(self.cancel_poll_s, HEARTBEAT_S) * 500)))
                if monitor in events:
                    self._connection_events(monitor)
                if socket in events:
                    try:
                        self._receive_all(socket)
                    except Exception as err:  # never end the thread: every request needs it
                        self.log(f"receiving from the queue owner failed: {err!r}")
                if self._wake.fd in events:
                    self._wake.take()
                if self._outgoing and self._send_pending(socket):
                    last_sent = time.monotonic()
                now = time.monotonic()
                self.tick()
                if now - last_polled >= self.cancel_poll_s / 2:
                    last_polled = now
                    if self._send_cancellations(socket, now):
                        last_sent = now
                if now - last_sent >= HEARTBEAT_S and self._connected.is_set():
                    with contextlib.suppress(zmq.Again):
                        socket.send(HEARTBEAT, zmq.NOBLOCK)
                    last_sent = now
        finally:
            self._fail_all(ServeError(Reason.SHUTDOWN, "the model is stopping; retry"))
            socket.disable_monitor()
            monitor.close(linger=0)
            socket.close(linger=0)

    def _connection_events(self, monitor: zmq.Socket) -> None:
        while monitor.poll(0):
            event = recv_monitor_message(monitor)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._connected.set()
            elif event == zmq.EVENT_DISCONNECTED:
                self._connected.clear()
                self.log("the queue owner went away: the requests in flight are answered 503")
                in_flight, self._in_flight = self._in_flight, {}
                self._lost(
                    in_flight.values(), "the model's queue owner stopped before answering; retry"
                )

    def _send_pending(self, socket: zmq.Socket) -> bool:
        batch = []
        while self._outgoing:
            batch.append(self._outgoing.popleft())
        now = time.monotonic()
        frames = encode_submit([rid for rid, _ in batch], [e.request for _, e in batch], now)
        try:
            socket.send_multipart(frames, zmq.NOBLOCK, copy=False)
        except zmq.Again:  # no owner connected (starting, or restarting)
            self._lost((e for _, e in batch), "the model's queue owner is not running; retry")
            return False
        ask_at = now + self.cancel_poll_s
        for rid, entry in batch:
            entry.ask_at = ask_at
            self._in_flight[rid] = entry
        return True

    def _receive_all(self, socket: zmq.Socket) -> None:
        for _, body in received(socket):
            if bytes(body[0]) != ANSWERS:
                self.log(f"a message of unknown kind from the queue owner: {bytes(body[0])[:32]!r}")
                continue
            try:
                outcomes = decode_answers(body, self.output_width)
            except WireError as err:
                self.log(f"an answer from the queue owner did not decode: {err}")
                continue
            for rid, outcome in outcomes:
                entry = self._in_flight.pop(rid, None)
                if entry is None:
                    continue
                if (
                    isinstance(outcome, ServeError)
                    and outcome.reason is Reason.CANCELLED
                    and not entry.cancel_sent
                ):
                    # the owner dropped it because this front was silent (stopped, then
                    # resumed); the owner counted it, as cancelled
                    outcome = ServeError(
                        Reason.OWNER_LOST,
                        "the model's front stalled and its queued request was dropped; retry",
                    )
                self._answer(entry, outcome)

    def _send_cancellations(self, socket: zmq.Socket, now: float) -> bool:
        cancelled = []
        for rid, entry in self._in_flight.items():
            if entry.cancel_sent or now < entry.ask_at:
                continue
            entry.ask_at = now + self.cancel_poll_s
            if entry.request.is_cancelled():
                entry.cancel_sent = True
                cancelled.append(rid)
        if not cancelled:
            return False
        try:
            socket.send_multipart(encode_cancel(cancelled), zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False  # no owner: the disconnection answers them
        return True

    def _lost(self, entries: Iterable[_InFlight], message: str) -> None:
        """Answers requests the owner will never answer ``owner_lost``, each counted here."""
        for entry in entries:
            self.refused(Reason.OWNER_LOST)
            self._answer(entry, ServeError(Reason.OWNER_LOST, message))

    def _fail_all(self, error: ServeError) -> None:
        in_flight, self._in_flight = self._in_flight, {}
        for entry in in_flight.values():
            self._answer(entry, error)
        while self._outgoing:
            self._answer(self._outgoing.popleft()[1], error)

    def _answer(self, entry: _InFlight, outcome: Outcome) -> None:
        try:
            entry.request.respond(outcome)
        except Exception as err:  # one answer's failure must not end the thread
            self.log(f"answering a request failed: {err!r}")
