"""The queue shared between clients: one line per client, taken by deficit round-robin.

Pure: items and their row counts in, items out; no threads, no tensors. The scheduler holds one
under its lock.

- **Service order.** Each step takes whole requests, one round over the clients waiting: a
  client's deficit grows by ``quantum_rows`` at its visit and pays for its requests, oldest
  first (deficit round-robin, Shreedhar and Varghese 1995). With one client waiting everything
  is taken, as before; with more, a step takes one quantum of each (all of a client's rows if it
  has fewer), so a client that sends a row now waits for one round of the others' rows, not for
  everything they queued, and many light clients are still planned together in one step. A
  step running when a client with no rows left in it sends more is cut short by the scheduler
  after its current forward (``has_client_besides``), the rest of its rows queued again.
- **Admission.** The queue holds ``max_rows`` rows. When it is full, a client over its share
  (``max_rows`` / active clients, itself counted) is refused, and only its own rows; a client
  under its share is admitted beyond the bound, by at most one share, so the rows queued never
  exceed twice ``max_rows``.

A client is a name (the front door's, from the API key or the address); "" is the one client
of a server nobody names. ``ClassedQueue`` keeps one such queue per service class.

Given a ``measure`` (an item's rows counted by length, say), a queue keeps the sum over what it
holds (``measured``): an item's measure must not change while it is queued.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

T = TypeVar("T")
SCAN_ITEMS = 128  # the most requests ``take_counted`` looks at in one call


@dataclass(slots=True)
class _Line(Generic[T]):
    """One client's queued requests, oldest first, with their rows."""

    items: deque[tuple[T, int]] = field(default_factory=deque)
    rows: int = 0
    deficit: int = 0  # rows it may still take before the next client's turn


class FairQueue(Generic[T]):
    def __init__(
        self,
        max_rows: int,
        quantum_rows: int,
        measure: Callable[[T], np.ndarray] | None = None,
    ) -> None:
        self.max_rows = max_rows  # the bound on rows queued (a client under its share may pass it)
        # rows a client's deficit grows by at each visit: at least a request's most rows, so that
        # every visit takes at least one request
        self.quantum_rows = quantum_rows
        self._lines: dict[str, _Line[T]] = {}  # the clients with rows queued
        self._turn: deque[str] = deque()  # the visiting order; its head is visited next
        self.rows = 0  # rows queued, every client
        self._measure = measure
        self.measured: np.ndarray | None = None  # the sum of the items' measures, once one came

    def __len__(self) -> int:
        return self.rows

    @property
    def clients(self) -> int:
        """Clients with rows queued."""
        return len(self._lines)

    def has_client_besides(self, clients: frozenset[str]) -> bool:
        """Whether a client outside ``clients`` has rows queued (a newcomer to a step)."""
        return any(client not in clients for client in self._lines)

    def rows_of(self, client: str) -> int:
        line = self._lines.get(client)
        return line.rows if line is not None else 0

    def refusal(self, client: str, rows: int, queued: int | None = None) -> str | None:
        """Why ``rows`` more of ``client``'s rows are not admitted, or None if they are;
        ``queued``: the rows judged against the bound, if not this queue's."""
        queued = self.rows if queued is None else queued
        if queued + rows <= self.max_rows:
            return None
        mine = self.rows_of(client)
        sharing = self.clients + (0 if client in self._lines else 1)
        share = self.max_rows // sharing
        if mine + rows <= share and queued + rows <= 2 * self.max_rows:
            return None
        if sharing == 1:
            return f"queue full: {queued} rows queued, the limit is {self.max_rows}"
        return (
            f"queue full: {queued} rows queued, the limit is {self.max_rows}; this client "
            f"holds {mine}, its share of {sharing} clients is {share}"
        )

    def push(self, client: str, item: T, rows: int) -> None:
        line = self._line(client)
        line.items.append((item, rows))
        line.rows += rows
        self.rows += rows
        self._count(item, 1)

    def _count(self, item: T, sign: int) -> None:
        if self._measure is not None:
            measure = self._measure(item)
            if self.measured is None:
                self.measured = np.zeros_like(measure)
            self.measured += sign * measure

    def push_front(self, returned: Iterable[tuple[str, T, int]]) -> None:
        """Items a step took and did not run (a waiting policy), back ahead of their clients'
        lines, in the order given."""
        by_client: dict[str, list[tuple[T, int]]] = {}
        for client, item, rows in returned:
            by_client.setdefault(client, []).append((item, rows))
        for client, items in by_client.items():
            line = self._line(client)
            line.items.extendleft(reversed(items))
            added = sum(rows for _, rows in items)
            line.rows += added
            line.deficit += added  # taken and not run: refunded
            self.rows += added
            for item, _ in items:
                self._count(item, 1)

    def take(self) -> list[T]:
        """One step's requests: everything while one client waits; else one round of deficit
        round-robin over the clients waiting, whole requests."""
        taken: list[T] = []
        if len(self._lines) == 1:
            (client,) = self._lines
            taken = [item for item, _ in self._lines[client].items]
            self._drop(client)
            self.rows = 0
            if self.measured is not None:
                self.measured[:] = 0
            return taken
        for _ in range(len(self._turn)):
            client = self._turn[0]
            line = self._lines[client]
            line.deficit += self.quantum_rows
            while line.items and line.items[0][1] <= line.deficit:
                item, rows = line.items.popleft()
                line.deficit -= rows
                line.rows -= rows
                self.rows -= rows
                self._count(item, -1)
                taken.append(item)
            if not line.items:
                self._drop(client)
            else:  # its turn is over; what its deficit did not spend waits for its next one
                self._turn.rotate(-1)
        return taken

    def take_rows(self, limit: int, at_least_one: bool = False) -> list[T]:
        """Whole requests of at most ``limit`` rows in all (with ``at_least_one``, the first
        request however large), the clients' oldest first, in turn; each charged to its
        client's deficit, as ``take`` charges it (``push_front`` refunds it)."""
        taken: list[T] = []
        progress = True
        while limit > 0 and progress:
            progress = False
            for client in list(self._turn):
                line = self._lines[client]
                first = at_least_one and not taken
                if line.items and (line.items[0][1] <= limit or first):
                    item, rows = line.items.popleft()
                    line.deficit -= rows
                    line.rows -= rows
                    self.rows -= rows
                    self._count(item, -1)
                    limit -= rows
                    taken.append(item)
                    progress = True
                    if not line.items:
                        self._drop(client)
        return taken

    def take_counted(self, limit: int, counted: Callable[[T], int]) -> list[T]:
        """The requests of which ``counted`` counts rows (those a step can use), each client's
        oldest first, one a client in turn, until they count ``limit``; the others keep their
        places. Looks at ``SCAN_ITEMS`` requests at most; each charged to its client's deficit,
        as ``take_rows`` charges it."""
        taken: list[T] = []
        looked = 0
        next_at = dict.fromkeys(self._turn, 0)  # each line's next request to look at
        progress = True
        while limit > 0 and progress:
            progress = False
            for client, k in next_at.items():
                items = self._lines[client].items
                while k < len(items) and looked < SCAN_ITEMS:
                    looked += 1
                    item, rows = items[k]
                    if useful := counted(item):
                        del items[k]
                        self._lines[client].deficit -= rows
                        self._lines[client].rows -= rows
                        self.rows -= rows
                        self._count(item, -1)
                        taken.append(item)
                        limit -= useful
                        progress = True
                        break
                    k += 1
                next_at[client] = k
                if limit <= 0:
                    break
        for client in next_at:
            if not self._lines[client].items:
                self._drop(client)
        return taken

    def _line(self, client: str) -> _Line[T]:
        line = self._lines.get(client)
        if line is None:
            line = self._lines[client] = _Line()
            self._turn.append(client)
        return line

    def _drop(self, client: str) -> None:
        """An empty line leaves, and its deficit with it (an idle client saves no credit)."""
        del self._lines[client]
        self._turn.remove(client)


class ClassedQueue(Generic[T]):
    """The queue of a server with service classes: one ``FairQueue`` per class, 1 served first.

    A request is judged against the rows of its own class and every higher one (a lower class's
    rows never count against it), so a full queue refuses the lowest class over its share first;
    within a class, clients share as in ``FairQueue``. With one class it is a FairQueue."""

    def __init__(
        self,
        classes: int,
        max_rows: int,
        quantum_rows: int,
        measure: Callable[[T], np.ndarray] | None = None,
    ) -> None:
        """``measure``: kept for every class where there are several (the rows of those below
        the first ride; those of the classes above a step's are carried)."""
        kept = measure if classes > 1 else None
        self.lines = [FairQueue[T](max_rows, quantum_rows, kept) for _ in range(classes)]

    def __len__(self) -> int:
        return sum(line.rows for line in self.lines)

    @property
    def classes(self) -> int:
        return len(self.lines)

    def waiting(self) -> list[int]:
        """The classes with rows queued, highest (1) first."""
        return [k + 1 for k, line in enumerate(self.lines) if line.rows]

    def higher_than(self, priority: int) -> bool:
        """Whether a class above ``priority`` has rows queued."""
        return any(line.rows for line in self.lines[: priority - 1])

    def below(self, priority: int) -> FairQueue[T] | None:
        """The first class below ``priority`` with rows queued (``take_rows``'s), if any."""
        return next((line for line in self.lines[priority:] if line.rows), None)

    def has_client_besides(self, priority: int, clients: frozenset[str]) -> bool:
        return self.lines[priority - 1].has_client_besides(clients)

    def refusal(self, priority: int, client: str, rows: int) -> str | None:
        ahead = sum(line.rows for line in self.lines[:priority])
        refused = self.lines[priority - 1].refusal(client, rows, ahead)
        if refused is None or self.classes == 1:
            return refused
        return f"{refused} (class {priority} and above)"

    def push(self, priority: int, client: str, item: T, rows: int) -> None:
        self.lines[priority - 1].push(client, item, rows)

    def push_front(self, returned: Iterable[tuple[int, str, T, int]]) -> None:
        """``FairQueue.push_front`` for (class, client, item, rows), each to its class's line."""
        by_class: dict[int, list[tuple[str, T, int]]] = {}
        for priority, client, item, rows in returned:
            by_class.setdefault(priority, []).append((client, item, rows))
        for priority, items in by_class.items():
            self.lines[priority - 1].push_front(items)

    def take(self, priority: int) -> list[T]:
        return self.lines[priority - 1].take()

    def take_rows_of(self, priority: int, limit: int) -> list[T]:
        """At least one request of class ``priority``, at most ``limit`` rows beyond it."""
        return self.lines[priority - 1].take_rows(limit, at_least_one=True)

    def take_rows(self, below: int, limit: int, counted: Callable[[T], int]) -> tuple[int, list[T]]:
        """Requests of the first class below ``below`` with rows queued, and that class; (0, [])
        where none waits: those of which ``counted`` counts rows, until they count ``limit``,
        the clients in turn, looking at ``SCAN_ITEMS`` at most (``FairQueue.take_counted``)."""
        for priority in range(below + 1, self.classes + 1):
            line = self.lines[priority - 1]
            if line.rows:
                return priority, line.take_counted(limit, counted)
        return 0, []
