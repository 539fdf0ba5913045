"""How a forward runs: the runner the scheduler chose once, at its start.

- ``InlineRunner``: on the scheduler thread; ``submit`` returns when the forward has run.
- ``OverlappedRunner`` (``overlap_forwards``): on an engine thread of its own, one at a time.
  ``submit`` returns at once, and the scheduler thread scatters and answers the forward before
  it, and pads the one after, while it runs. It pays where a forward releases the GIL while it
  waits (a GPU's); ONNX Runtime on the same cores gains nothing from it.

Both run a forward the same way (``run_forward``): the engine on padded inputs, timed, its error
caught (the scheduler splits and retries the forward), and which output rows are finite.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from python_backend.engines.base import Engine, run_padded
from python_backend.scheduling.records import Forward


def finite_rows(outputs: np.ndarray) -> np.ndarray:
    """[rows] bool: which rows of a forward's outputs are finite throughout. A row's sum is
    NaN or infinite when any of its values is (one matrix-vector product, a third of the cost
    of testing every value); only when one is, every value of the rows is tested, since a sum
    of finite values may also overflow."""
    with np.errstate(over="ignore", invalid="ignore"):
        sums = outputs @ np.ones(outputs.shape[1], outputs.dtype)
    if np.isfinite(sums).all():
        return np.ones(len(outputs), bool)
    return np.isfinite(outputs).all(axis=1)


@dataclass(eq=False, slots=True)
class Ran:
    """A forward that ran: its outputs and which of their rows are finite, or the error it
    raised; and its time."""

    forward: Forward
    outputs: np.ndarray | None
    error: Exception | None
    seconds: float
    finite: np.ndarray | None = None  # [rows] bool

    @property
    def settled_first(self) -> bool:
        """Whether its settling runs more forwards (a split, or rows run again alone): those
        run before anything else is submitted."""
        return self.error is not None or (self.finite is not None and not self.finite.all())


def run_forward(
    engine: Engine,
    forward: Forward,
    ids: np.ndarray,
    mask: np.ndarray,
    vocab_size: int | None,
    timer: Callable[[], float] = time.perf_counter,
) -> Ran:
    started = timer()
    try:
        outputs = run_padded(engine, ids, mask, vocab_size)
    except Exception as err:  # the scheduler splits and retries it
        return Ran(forward, None, err, timer() - started)
    return Ran(forward, outputs, None, timer() - started, finite_rows(outputs))


class Runner(Protocol):
    overlaps: bool  # submit returns before the forward has run

    def submit(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran | None:
        """Starts the forward (nothing else may be in flight): returns it run where it ran
        here, or None where it runs on (``wait`` returns it)."""

    def run_now(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran:
        """Runs the forward and returns it run (nothing may be in flight): by default, submits
        it and waits for it."""
        ran = self.submit(forward, ids, mask) or self.wait()
        assert ran is not None
        return ran

    def wait(self) -> Ran | None:
        """The forward in flight once it has run; None when none is."""

    @property
    def in_flight(self) -> Forward | None:
        """The forward submitted and not waited for yet, if any."""

    @property
    def ran(self) -> bool:
        """Whether ``wait`` returns at once: the forward in flight has run, or none is."""

    def wait_until(self, cond: threading.Condition, other: Callable[[], bool]) -> None:
        """Holding ``cond`` (notified as a forward has run and as a request comes), returns once
        the forward in flight has run or ``other`` holds."""

    def close(self) -> None:
        """After the last forward: ends the engine thread, if one runs."""


class InlineRunner:
    overlaps = False
    in_flight = None
    ran = True

    def __init__(self, engine: Engine, vocab_size: int | None, timer: Callable[[], float]) -> None:
        self.engine, self.vocab_size, self.timer = engine, vocab_size, timer

    def submit(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran | None:
        return self.run_now(forward, ids, mask)

    def run_now(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran:
        return run_forward(self.engine, forward, ids, mask, self.vocab_size, self.timer)

    def wait(self) -> Ran | None:
        return None

    def wait_until(self, cond: threading.Condition, other: Callable[[], bool]) -> None:
        pass

    def close(self) -> None:
        pass


class OverlappedRunner(Runner):
    overlaps = True

    def __init__(
        self,
        engine: Engine,
        vocab_size: int | None,
        timer: Callable[[], float],
        on_ran: Callable[[], None] = lambda: None,
    ) -> None:
        """``on_ran``: called on the engine thread as each forward has run."""
        self.engine, self.vocab_size, self.timer = engine, vocab_size, timer
        self.on_ran = on_ran
        self._jobs: queue.SimpleQueue[tuple[Forward, np.ndarray, np.ndarray] | None] = (
            queue.SimpleQueue()
        )
        self._ran: queue.SimpleQueue[Ran] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None  # started with the first forward
        self._in_flight: Forward | None = None

    @property
    def in_flight(self) -> Forward | None:
        return self._in_flight

    @property
    def ran(self) -> bool:
        return self._in_flight is None or not self._ran.empty()

    def submit(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran | None:
        assert self._in_flight is None, "one forward in flight at a time"
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="engine", daemon=True)
            self._thread.start()
        self._jobs.put((forward, ids, mask))
        self._in_flight = forward
        return None

    def wait(self) -> Ran | None:
        if self._in_flight is None:
            return None
        self._in_flight = None
        return self._ran.get()

    def wait_until(self, cond: threading.Condition, other: Callable[[], bool]) -> None:
        cond.wait_for(lambda: self.ran or other())

    def close(self) -> None:
        self._jobs.put(None)

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            self._ran.put(run_forward(self.engine, *job, self.vocab_size, self.timer))
            self.on_ran()


def runner_for(
    engine: Engine,
    vocab_size: int | None,
    overlap: bool,
    timer: Callable[[], float] = time.perf_counter,
    on_ran: Callable[[], None] = lambda: None,
) -> Runner:
    """The runner, timing forwards with ``timer`` (the simulator's: its virtual clock);
    ``on_ran``: called as a forward in flight has run (``OverlappedRunner``)."""
    if overlap:
        return OverlappedRunner(engine, vocab_size, timer, on_ran)
    return InlineRunner(engine, vocab_size, timer)
