"""The records of one request and its answer: what every owner takes and gives back, whether it
runs in the model's own process (``owners.LocalOwner``) or in a queue owner across a socket
(``transport.remote_owner.RemoteOwner``, ``transport.wire``); and the scheduler's own records of a
queued request (``Admitted``), one of its rows (``RowRef``) and a planned forward (``Forward``).

They are plain slotted dataclasses, not frozen ones: a frozen dataclass's __init__ sets each field
through object.__setattr__, about 3x slower, and building records was a fifth of the queue owner's
CPU (docs/ARCHITECTURE.md). Nothing changes them after they are made.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from python_backend.common.contract import ServeError

_CLAIM_LOCK = threading.Lock()  # makes Admitted.claim atomic across threads


@dataclass(eq=False, slots=True)
class Answer:
    """A request's outputs."""

    outputs: np.ndarray  # [rows, D] float32, row i for the request's row i
    num_tokens: np.ndarray  # [rows] int32: tokens each row ran with
    queue_s: float = 0.0  # from its arrival to its first forward's start
    inference_s: float = 0.0  # from its first forward's start to its last row computed


Outcome = Answer | ServeError
Respond = Callable[[Outcome], None]


def never_cancelled() -> bool:
    return False


@dataclass(eq=False, slots=True)
class Request:
    """What a client asked for; no owner changes it."""

    rows: list[np.ndarray]  # token ids per row, int64, at least one token each
    respond: Respond  # called exactly once, with an Answer or a ServeError
    deadline: float | None = None  # time.monotonic() after which it must not start computing
    is_cancelled: Callable[[], bool] = never_cancelled  # asked before it costs anything
    client: str = ""  # who sent it: the queue is shared between clients (fair_queue)
    priority: int = 1  # its service class: 1 is served first (ClassedQueue, Scheduler.take)


@dataclass(eq=False, slots=True)
class Admitted:
    """The scheduler's record of one queued request: its progress, which only the step changes."""

    request: Request
    arrival: int  # order of arrival (0, 1, 2, ...): ties in age break by it
    arrived_at: float  # clock time of submit: the request's age is now - arrived_at
    outputs: np.ndarray | None = None  # [rows, D], filled as its forwards complete
    remaining: int = 0  # rows still to compute
    started_at: float | None = None  # clock time its first forward started
    done: bool = False  # answered (either way)
    # row i computed: 1; None while none is (a step cut short queues the rest again)
    computed: bytearray | None = None
    lengths: np.ndarray | None = None  # each row's tokens, once asked (``rows_marked``)

    def __post_init__(self) -> None:
        self.remaining = len(self.request.rows)

    def rows_to_run(self) -> range | list[int]:
        """Indices of the rows not computed yet."""
        if self.computed is None:
            return range(len(self.request.rows))
        return [i for i, done in enumerate(self.computed) if not done]

    def rows_marked(self, marked: np.ndarray, longest: int) -> int:
        """Rows not computed yet whose token count ``marked`` marks (one longer than it: none);
        none where a row is longer than ``longest`` (it is refused)."""
        lengths = self._lengths_to_run()
        if lengths.size and lengths.max() > longest:
            return 0
        return int(np.count_nonzero(marked[np.minimum(lengths, len(marked) - 1)]))

    def rows_by_length(self, lengths: np.ndarray) -> np.ndarray:
        """Rows not computed yet counted by the first of ``lengths`` (ascending) that holds them;
        the last entry counts those longer than every one."""
        held = np.searchsorted(lengths, self._lengths_to_run())
        return np.bincount(held, minlength=len(lengths) + 1)

    def _lengths_to_run(self) -> np.ndarray:
        if self.lengths is None:
            rows = self.request.rows
            self.lengths = np.fromiter(map(len, rows), np.int64, len(rows))
        if self.computed is None:
            return self.lengths
        return self.lengths[np.frombuffer(self.computed, np.uint8) == 0]

    def claim(self) -> bool:
        """Marks the request answered; False if it already was (the one answer is sent once).
        One lock for every request: claims are rare and short, and a lock per request would cost
        more to make than all its claims to take."""
        with _CLAIM_LOCK:
            if self.done:
                return False
            self.done = True
            return True


@dataclass(eq=False, slots=True)
class RowRef:
    """One row of one admitted request."""

    owner: Admitted
    index: int  # the row's index within its request
    num_tokens: int  # its length: len(ids)

    @property
    def ids(self) -> np.ndarray:
        return self.owner.request.rows[self.index]


@dataclass(eq=False, slots=True)
class Forward:
    """One planned forward: plain data."""

    padded_length: int  # T: every row runs padded to this length (>= each row's tokens)
    rows: tuple[RowRef, ...]  # at most the layout's cap at T, in arrival order (then riders)
    oldest_arrival: int  # arrival order of the oldest request served: forwards run oldest first
    oldest_arrived_at: float  # when that request arrived: the forward's age is now - this
