"""The model's own queue and the one thread that plans and runs it.

One owner: ``submit`` (called from Triton's ``execute``) only appends under a lock; the scheduler
thread alone takes work, plans, runs forwards and decides the answers (a responder thread sends
them). Each request is answered exactly once: with its outputs, or with an error saying why
(queue full, deadline passed, cancelled, a forward that failed even alone, shutdown).

A step of the loop ("a collection"):
1. take everything queued;
2. answer cancelled requests and those whose deadline has passed, before they cost anything;
3. plan all their rows at once with the DP planner (or the per-bucket baseline);
4. run the groups oldest first: a group's age is that of the oldest request it serves, so the
   request that has waited longest is completed first, and a request is answered the moment its
   last row is computed, not at the end of the collection;
5. answers leave through a responder thread, so the next forward never waits on a send;
6. requests that arrive meanwhile wait for the next collection. A request therefore waits at most
   for the collection in flight and then its own: nothing starves behind a stream of newcomers.

When a forward fails (out of memory, an engine limit, a poisoned row) the group is split, not
halved: its rows are planned again under a token budget below the one that failed, so long rows
split off into groups of their own while the short ones stay together, and each part is retried.
A row that fails alone fails its request with the cause; every other request is still answered.
"""

from __future__ import annotations

import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from python_backend.cost_models import CostModel
from python_backend.engines.base import Engine, pad_rows
from python_backend.planner import per_bucket_groups, plan_batches, plan_cost

IDLE_WAKE_S = 0.25  # how often an idle scheduler wakes to publish metrics
# a response: (outputs [B, D] fp32, tokens per row [B] int32) or an error
Respond = Callable[[np.ndarray | None, np.ndarray | None, "ServeError | None"], None]


class ServeError(Exception):
    """Why a request got no outputs. ``kind``: queue_full, timeout, cancelled, failed, shutdown."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class SchedulerMetrics:
    """What the scheduler reports; the Triton model plugs in custom metrics, tests a recorder."""

    def queue_depth(self, rows: int) -> None: ...

    def forward(self, padded_length: int, rows: int, real_tokens: int, seconds: float) -> None: ...

    def plan(self, planned_cost: float, per_bucket_cost: float) -> None: ...

    def refused(self, reason: str) -> None: ...

    def split(self, padded_length: int, rows: int) -> None: ...

    def flush_if_due(self) -> None:
        """Publishes what was recorded, if it has waited long enough (between forwards, idle)."""

    def flush(self) -> None:
        """Publishes what was recorded now (when the scheduler stops)."""


@dataclass(eq=False)
class PendingRequest:
    rows: list[np.ndarray]  # token ids per row, int64
    respond: Respond  # called exactly once
    deadline: float | None = None  # time.monotonic() after which it must not start computing
    is_cancelled: Callable[[], bool] = lambda: False
    arrival: int = 0  # set by submit: order of arrival
    outputs: np.ndarray | None = None  # [B, D], filled as groups complete
    remaining: int = 0  # rows still to compute
    done: bool = False  # answered (either way)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.remaining = len(self.rows)

    def claim(self) -> bool:
        """Marks the request answered; False if it already was (the one response is sent once)."""
        with self._lock:
            if self.done:
                return False
            self.done = True
            return True

    def send(self, outputs: np.ndarray | None, error: ServeError | None) -> None:
        """Sends the response of a claimed request."""
        tokens = np.array([len(r) for r in self.rows], dtype=np.int32)
        self.respond(outputs if error is None else None, tokens if error is None else None, error)

    def answer(self, outputs: np.ndarray | None, error: ServeError | None) -> bool:
        """Claims and sends at once; False if it was already answered."""
        if not self.claim():
            return False
        self.send(outputs, error)
        return True


@dataclass(frozen=True)
class _Row:
    request: PendingRequest
    index: int  # row index within its request

    @property
    def ids(self) -> np.ndarray:
        return self.request.rows[self.index]


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        pad_token_id: int,
        cost: CostModel,
        max_batch: int,
        max_queue_rows: int,
        planner: str = "dp",
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.layout = engine.layout
        self.pad_token_id = pad_token_id
        self.cost = cost
        self.max_batch = max_batch
        self.max_queue_rows = max_queue_rows
        self.plan_fn = plan_batches if planner == "dp" else per_bucket_groups
        self.metrics = metrics or SchedulerMetrics()
        self.clock = clock
        self._queue: list[PendingRequest] = []
        self._queued_rows = 0
        self._cond = threading.Condition()
        self._accepting = True
        self._stop = False
        self._arrivals = itertools.count()
        self._thread: threading.Thread | None = None
        # answers leave through their own thread once started: sending a response is a message
        # to the server, and the next forward should not wait for it
        self._outbox: (
            queue.SimpleQueue[tuple[PendingRequest, np.ndarray | None, ServeError | None] | None]
            | None
        ) = None
        self._responder: threading.Thread | None = None

    # -- the handle Triton's execute uses -------------------------------------------------------

    def submit(self, request: PendingRequest) -> None:
        """Queues a request, or answers it at once (queue full, shutting down)."""
        num_rows = len(request.rows)
        with self._cond:
            if not self._accepting:
                error = ServeError(
                    "shutdown", "the server is shutting down; retry on another instance"
                )
            elif self._queued_rows + num_rows > self.max_queue_rows:
                error = ServeError(
                    "queue_full",
                    f"queue full: {self._queued_rows} rows queued, the limit is "
                    f"{self.max_queue_rows}; retry later",
                )
            else:
                request.arrival = next(self._arrivals)
                self._queue.append(request)
                self._queued_rows += num_rows
                self.metrics.queue_depth(self._queued_rows)
                self._cond.notify()
                return
        self.metrics.refused(error.kind)
        request.answer(None, error)

    def start(self) -> None:
        self._outbox = queue.SimpleQueue()
        self._responder = threading.Thread(target=self._send_loop, name="responder", daemon=True)
        self._responder.start()
        self._thread = threading.Thread(target=self._loop, name="batch-scheduler", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops accepting, finishes what is queued (up to ``timeout_s``), answers the rest."""
        with self._cond:
            self._accepting = False
            self._stop = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout_s)
        with self._cond:
            leftover, self._queue, self._queued_rows = self._queue, [], 0
        for request in leftover:
            self._finish(
                request,
                None,
                ServeError("shutdown", "the server shut down before this request ran"),
            )
        if self._outbox is not None and self._responder is not None:
            self._outbox.put(None)  # after every answer queued before it
            self._responder.join(timeout_s)

    def _finish(
        self, request: PendingRequest, outputs: np.ndarray | None, error: ServeError | None
    ) -> None:
        """Answers a request once: through the responder thread when running, else here."""
        if not request.claim():
            return
        if self._outbox is not None:
            self._outbox.put((request, outputs, error))
        else:
            request.send(outputs, error)

    def _send_loop(self) -> None:
        assert self._outbox is not None
        while True:
            item = self._outbox.get()
            if item is None:
                return
            request, outputs, error = item
            # a send that fails means the client's connection is gone: nothing left to tell it
            with contextlib.suppress(Exception):
                request.send(outputs, error)

    # -- the scheduler thread -------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._queue and not self._stop:
                    # idle: wake now and then, so metrics recorded meanwhile (refusals in
                    # execute) are published even when no forward runs
                    self._cond.wait(timeout=IDLE_WAKE_S)
                if not self._queue:
                    collection = None
                else:
                    collection, self._queue, self._queued_rows = self._queue, [], 0
                    self.metrics.queue_depth(0)
                stopping = self._stop
            if collection is None:
                # outside the lock, so submit never waits on it; when due only, so a request
                # arriving right after a forward does not wait on a flush either
                if stopping:
                    self.metrics.flush()
                    return
                self.metrics.flush_if_due()
                continue
            try:
                self.run_collection(collection)
            except Exception as err:  # never lose a request, never kill the thread
                for request in collection:
                    self._finish(
                        request, None, ServeError("failed", f"internal scheduler error: {err!r}")
                    )

    def run_collection(self, collection: list[PendingRequest]) -> None:
        """Plans and runs one collection of requests; answers every one of them."""
        live = [r for r in collection if self._still_wanted(r)]
        rows = [_Row(r, i) for r in live for i in range(len(r.rows))]
        if not rows:
            return
        lengths = [len(row.ids) for row in rows]
        args = (lengths, self.layout.pad_len, self.layout.max_rows, self.max_batch)
        groups = self.plan_fn(*args, cost=self.cost, mergeable=self.layout.mergeable)
        planned = plan_cost(groups, self.cost)
        if self.plan_fn is per_bucket_groups:  # the plan is the baseline: no second grouping
            baseline = planned
        else:
            baseline = plan_cost(
                per_bucket_groups(*args, mergeable=self.layout.mergeable), self.cost
            )
        self.metrics.plan(planned, baseline)
        # oldest first: a group is as old as the oldest request it serves (rows are in arrival
        # order, so its first row's request is that one)
        groups.sort(key=lambda g: (rows[g[1][0]].request.arrival, rows[g[1][0]].index))
        for padded_length, members in groups:
            # asked once per request, not per row: is_cancelled is a message to the server
            wanted: dict[PendingRequest, bool] = {}
            for i in members:
                if rows[i].request not in wanted:
                    wanted[rows[i].request] = self._still_wanted(rows[i].request)
            group = [rows[i] for i in members if wanted[rows[i].request]]
            if group:
                self._run_group(padded_length, group)

    def _still_wanted(self, request: PendingRequest) -> bool:
        """False (after answering it) for a request that is done, cancelled or past its deadline."""
        if request.done:
            return False
        if request.deadline is not None and self.clock() > request.deadline:
            self.metrics.refused("timeout")
            self._finish(
                request, None, ServeError("timeout", "deadline exceeded before the request ran")
            )
            return False
        if request.is_cancelled():
            self.metrics.refused("cancelled")
            self._finish(request, None, ServeError("cancelled", "the client cancelled the request"))
            return False
        return True

    def _run_group(self, padded_length: int, group: list[_Row]) -> None:
        ids, mask = pad_rows([row.ids for row in group], padded_length, self.pad_token_id)
        started = time.perf_counter()
        try:
            out = self.engine.run(ids, mask)
            if out.shape[0] != len(group):
                raise RuntimeError(f"engine returned {out.shape[0]} rows for {len(group)}")
        except Exception as err:
            self._split_and_retry(padded_length, group, err)
            return
        self.metrics.forward(
            padded_length, len(group), int(mask.sum()), time.perf_counter() - started
        )
        self.metrics.flush_if_due()
        for row, values in zip(group, out, strict=True):
            request = row.request
            if request.done:
                continue
            if request.outputs is None:
                request.outputs = np.empty((len(request.rows), out.shape[1]), dtype=np.float32)
            request.outputs[row.index] = values
            request.remaining -= 1
            if request.remaining == 0:
                self._finish(request, request.outputs, None)

    def _split_and_retry(self, padded_length: int, group: list[_Row], err: Exception) -> None:
        if len(group) == 1:
            row = group[0]
            self._finish(
                row.request,
                None,
                ServeError(
                    "failed",
                    f"row {row.index} ({len(row.ids)} tokens) failed even alone: "
                    f"{type(err).__name__}: {err}",
                ),
            )
            self.metrics.refused("forward_failed")
            return
        self.metrics.split(padded_length, len(group))
        # a budget strictly below what failed: long rows split off, short ones stay together
        budget = max(1, (len(group) * padded_length) // 2)

        def max_rows(t: int) -> int:
            return max(1, min(self.layout.max_rows(t), budget // t))

        lengths = [len(row.ids) for row in group]
        parts = self.plan_fn(
            lengths,
            self.layout.pad_len,
            max_rows,
            self.max_batch,
            cost=self.cost,
            mergeable=self.layout.mergeable,
        )
        if len(parts) == 1:  # cannot happen (the budget shrank), but never loop on it
            parts = [(padded_length, [i]) for i in range(len(group))]
        for part_length, members in parts:
            part = [group[i] for i in members if not group[i].request.done]
            if part:
                self._run_group(part_length, part)
