"""The model's own queue, and the step that plans, runs and answers it.

One owner: ``submit`` (called from Triton's ``execute``) only appends under a lock; one caller of
``step`` (the scheduler thread when serving; a test or the simulator driving it directly, with an
injected clock) takes work, plans, runs forwards and decides the answers. Each request is answered
exactly once: with its outputs, or with an error saying why (queue full, deadline passed,
cancelled, a forward that failed even alone, shutdown).

A step:
1. ``take``: everything queued becomes one collection;
2. ``admit``: cancelled requests and those whose deadline has passed are answered before they
   cost anything;
3. ``plan``: the policy sees every row with its length and its request's arrival time and the
   step's ``now``, and returns forwards (plain data: padded length, rows, age; ``policy``). A
   policy may leave rows waiting (``PolicyPlan.waiting``), which go back to the front of the
   queue; the served policies run everything at once, with the DP planner or the per-bucket
   baseline;
4. forwards run oldest first (a forward is as old as the oldest request it serves), so the request
   that waited longest completes first; each forward is ``run`` (padded, handed to the runner
   chosen at the start, inline or overlapped: ``runners``) and ``complete``d (its outputs
   scattered, each request whose last row is done answered);
5. answers leave through a responder thread when one runs, so the next forward never waits on a
   send. Requests that arrive meanwhile wait for the next step: a request waits at most for the
   step in flight and then its own (a request of a higher class, for the forward in flight), and
   nothing starves behind newcomers.

When a forward fails (out of memory, an engine limit, a poisoned row) it is split, not halved: its
rows are planned again, by the same planning call, under a token budget below the one that failed,
so long rows split off into forwards of their own while short ones stay together, and each part is
retried. A row that fails alone fails its request with the cause; every other request is answered.
"""

from __future__ import annotations

import bisect
import itertools
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from python_backend.common.contract import MAX_ROWS_PER_REQUEST, Reason, ServeError
from python_backend.common.cost_models import CostModel, cost_row
from python_backend.engines.base import BucketLayout, Engine, pad_rows
from python_backend.scheduling.fair_queue import ClassedQueue, FairQueue
from python_backend.scheduling.planner import Group, PlanLayout, per_bucket_cost, plan_cost
from python_backend.scheduling.policy import (
    BudgetLayout,
    Policy,
    QueuedRows,
    ServiceClasses,
    capped_layout,
    policy_named,
)
from python_backend.scheduling.records import Admitted, Answer, Forward, Outcome, Request, RowRef
from python_backend.scheduling.runners import Ran, Runner, finite_rows, runner_for

IDLE_WAKE_S = 0.25  # how often an idle scheduler thread wakes to publish metrics


class SchedulerMetrics:
    """What the scheduler reports; the Triton model plugs in custom metrics, tests a recorder."""

    def queue_depth(self, rows: int) -> None: ...

    def forward(self, padded_length: int, rows: int, real_tokens: int, seconds: float) -> None: ...

    def plan(self, planned_cost: float, per_bucket_cost: float) -> None: ...

    def refused(self, reason: Reason, priority: int = 1) -> None: ...

    def split(self, padded_length: int, rows: int) -> None: ...

    def answered(
        self, queue_s: float, inference_s: float, priority: int = 1, rows: int = 1
    ) -> None:
        """A request of ``rows`` rows in class ``priority`` answered with its outputs: how long
        it queued, how long it computed."""

    def flush_if_due(self) -> None:
        """Publishes what was recorded, if it has waited long enough (between forwards, idle)."""

    def flush(self) -> None:
        """Publishes what was recorded now (when the scheduler stops)."""


def clients_after_each(forwards: list[Forward]) -> list[frozenset[str]]:
    """For each forward, the clients with rows in the forwards after it."""
    later: list[frozenset[str]] = []
    seen: set[str] = set()
    for forward in reversed(forwards):
        later.append(frozenset(seen))
        seen.update(row.owner.request.client for row in forward.rows)
    later.reverse()
    return later


class Scheduler:
    def __init__(
        self,
        engine: Engine,
        pad_token_id: int,
        cost: CostModel,
        max_batch: int,
        max_queue_rows: int,
        policy: Policy | str = "dp",
        metrics: SchedulerMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
        overlap: bool = False,
        log: Callable[[str], None] = lambda message: None,
        vocab_size: int | None = None,
        classes: ServiceClasses | None = None,
        timer: Callable[[], float] = time.perf_counter,
        runner: Runner | None = None,
    ) -> None:
        self.engine = engine
        self.log = log  # what went wrong with the engine's outputs, for the operator
        self.layout: BucketLayout = engine.layout.capped(max_batch)
        self.pad_token_id = pad_token_id
        self.cost = cost
        self.max_queue_rows = max_queue_rows
        self.policy = policy_named(policy) if isinstance(policy, str) else policy
        self.metrics = metrics or SchedulerMetrics()
        self.clock = clock
        # shared between clients: whole requests, one round of deficit round-robin a step, the
        # highest class waiting first (ServiceClasses)
        self.classes = classes or ServiceClasses()
        by_length = np.asarray(self.layout.lengths)
        self._queue: ClassedQueue[Admitted] = ClassedQueue(
            self.classes.classes,
            max_queue_rows,
            quantum_rows=MAX_ROWS_PER_REQUEST,
            measure=lambda owner: owner.rows_by_length(by_length),  # riders' lengths (_fill)
        )
        self._step_priority = 1  # the class the step in progress serves
        self._step_is_top = True  # it serves the highest class waiting (not a starved one)
        self._step_cap: BudgetLayout | None = None  # its capped layout, if capped
        # the next class's requests the step took to ride: answered by the step if it fails
        self._riders: list[Admitted] = []
        self._partial: list[Admitted] = []  # riders with rows left, queued again after the step
        # requests with a row in the forward in flight that the step did not finish (riders with
        # rows left, a step cut short): queued again when it completes (no row is ever both in
        # flight and queued)
        self._held: list[Admitted] = []
        self._unsettled: Ran | None = None  # a forward that has run, taken from the runner
        self._cost_rows: dict[int, tuple[list[float], list[float]]] = {}  # _costs_at
        self._ride_at: list[int] = []  # the length each of the step's forwards runs at, riders in
        self._budgets: list[float] = []  # the cost each may reach with riders (_rider_budget)
        self._submitted_at = 0.0  # clock time the forward in flight was submitted (overlap)
        self._shares: dict[int, float] = {}  # a rider's share of a forward of its own, by length
        self._seen_at = [-float("inf")] * self.classes.classes  # each class's last arrival
        # the engine's recent work per class, in cost units, decaying; and its seconds per unit
        self._served = [0.0] * self.classes.classes
        self._served_at = clock()
        self._seconds_per_unit: float | None = None
        self._wake_at: float | None = None  # a waiting policy's next planning time
        self._cond = threading.Condition()
        self._accepting = True
        self._stop = False
        self._arrivals = itertools.count()
        self._thread: threading.Thread | None = None
        # answers leave through their own thread once started: sending a response is a message
        # to the server, and the next forward should not wait for it. Under the lock, an answer
        # goes to the outbox while it is open, else it is sent at once: none is ever dropped.
        self._outbox: queue.SimpleQueue[tuple[Admitted, Outcome] | None] | None = None
        self._outbox_lock = threading.Lock()
        self._responder: threading.Thread | None = None
        # overlap: forwards run on an engine thread, one ahead of the scheduler thread's own
        # work on them; a request with a row in the one in flight is queued again only once it
        # has completed (``_held``), so no row is ever both in flight and queued. Ids are
        # checked against ``vocab_size`` again before each forward (a queue owner's fronts
        # decoded them; an id past the vocabulary fails its row alone, through the split below,
        # never the forward)
        # forwards are timed with ``timer``; ``runner``: one of the caller's in place of
        # ``overlap``'s, on the scheduler's own thread (the simulator's, on its virtual clock)
        self.runner = runner or runner_for(engine, vocab_size, overlap, timer, self._ran_one)

    # -- the handle Triton's execute uses -------------------------------------------------------

    def submit(self, request: Request) -> None:
        """Queues a request, or answers it at once (queue full, shutting down)."""
        num_rows = len(request.rows)
        with self._cond:
            if not self._accepting:
                error = ServeError(
                    Reason.SHUTDOWN, "the server is shutting down; retry on another instance"
                )
            elif not 1 <= request.priority <= self.classes.classes:
                error = ServeError(
                    Reason.BAD_PARAMETER,
                    f"parameter priority is {request.priority}, not a class of this model (1 to "
                    f"{self.classes.classes}, 1 first)",
                )
            elif (
                full := self._queue.refusal(request.priority, request.client, num_rows)
            ) is not None:
                error = ServeError(Reason.QUEUE_FULL, f"{full}; retry later")
            else:
                admitted = Admitted(request, next(self._arrivals), self.clock())
                self._queue.push(request.priority, request.client, admitted, num_rows)
                self._seen_at[request.priority - 1] = admitted.arrived_at
                self.metrics.queue_depth(len(self._queue))
                self._cond.notify()
                return
        self._finish(Admitted(request, -1, self.clock()), error)

    @property
    def queued_rows(self) -> int:
        """Rows waiting for a step."""
        with self._cond:
            return len(self._queue)

    @property
    def wake_at(self) -> float | None:
        """When a waiting policy wants the next step if nothing arrives (None: at once)."""
        with self._cond:
            return self._wake_at

    # -- the step -------------------------------------------------------------------------------

    def take(self) -> list[Admitted]:
        """One step's requests, oldest first, of one class (the highest waiting, unless a lower
        one is starved: ``ServiceClasses``): everything queued while one client waits, else one
        round of the clients' shares (fair_queue). Serving the highest class, the next class's
        requests may ride in its forwards (``plan``)."""
        with self._cond:
            waiting = self._queue.waiting()
            collection: list[Admitted] = []
            if waiting:
                priority = self._step_priority = self._pick(waiting)
                self._step_is_top = priority == waiting[0]
                self._step_cap = self._cap_for(priority)
                if self._step_cap is None:
                    collection = self._queue.take(priority)
                else:  # rows for about one capped forward per length: the step yields soon,
                    # and fewer rows would plan forwards part full (measured: bench.fairness)
                    most = max(self._step_cap.max_rows(t) for t in self.layout.lengths)
                    collection = self._queue.take_rows_of(priority, len(self.layout.lengths) * most)
            self._wake_at = None
            if collection:
                self.metrics.queue_depth(len(self._queue))
        collection.sort(key=lambda owner: owner.arrival)
        return collection

    def _pick(self, waiting: list[int]) -> int:
        """The class a step serves: the highest waiting, unless a lower one's share of the
        engine's recent work is under ``min_share``."""
        self._decay_served()
        total = sum(self._served)
        for priority in waiting[1:]:
            if total > 0 and self._served[priority - 1] < self.classes.min_share * total:
                return priority
        return waiting[0]

    def _decay_served(self) -> None:
        now = self.clock()
        keep = 0.5 ** ((now - self._served_at) / self.classes.share_window_s)
        self._served = [units * keep for units in self._served]
        self._served_at = now

    def step(self, now: float | None = None, finish_last: bool = True) -> list[Forward]:
        """One step: take, admit, plan, then execute and complete each forward, oldest first.
        Returns the forwards planned. Never raises: an internal error fails its requests.
        With ``overlap`` and not ``finish_last`` (the scheduler thread's loop), the last forward
        may still be in flight when it returns: the next step is planned while it runs."""
        collection = self.take()
        self._riders, self._partial = [], []
        if not collection:
            return []
        try:
            now = self.clock() if now is None else now
            forwards = self.plan(self.admit(collection), now)
            later = clients_after_each(forwards)
            waiting = {row.owner.request.client for f in forwards for row in f.rows}
            for k, forward in enumerate(forwards):
                # a higher class came while the forward before ran: it runs next (a step runs
                # one forward at least, so a lower class always gets on, carrying what of the
                # higher class fits in it)
                ran = self.run(forward, yields=k > 0)
                if ran is None:
                    self._requeue_forwards(forwards[k:])
                    if finish_last:
                        self.settle()
                    return forwards[:k]
                forwards[k] = ran
                waiting -= {row.owner.request.client for row in forward.rows}
                # a client with no rows left in this step sent more (once every client of the
                # step has had a forward: a client sending as fast as it is answered never
                # holds the others' rows back for good), or a higher class arrived
                newcomer = not waiting and self._newcomer(later[k])
                if k + 1 < len(forwards) and (newcomer or self._outranked()):
                    # the rest waits for the next step, where the queue's shares include the
                    # newcomer, after this forward, not after every forward this step planned
                    self._requeue_forwards(forwards[k + 1 :])
                    if finish_last:
                        self.settle()
                    return forwards[: k + 1]
            if finish_last:
                self.settle()
            if self._partial:  # queued again once no row of theirs is in flight
                self._requeue_forwards([])
            return forwards
        except Exception as err:  # never lose a request, never kill the thread
            self._settle_after_error(err)
            for owner in (*collection, *self._riders):
                self._finish(
                    owner, ServeError(Reason.INTERNAL, f"internal scheduler error: {err!r}")
                )
            return []

    def admit(self, collection: list[Admitted]) -> list[Admitted]:
        """The requests still wanted; the others are answered now (timeout, cancelled)."""
        return [owner for owner in collection if self._still_wanted(owner)]

    def plan(self, live: list[Admitted], now: float) -> list[Forward]:
        """The policy's forwards for these requests, oldest first (with clients sharing the
        step, those of its lightest clients first); rows it leaves waiting are queued again,
        ahead of anything that arrived meanwhile. Serving the highest class waiting, rows of the
        next class's requests ride in them where that saves cost (``_take_riders``, ``_ride``),
        a request whole or in part; what does not ride is queued again."""
        rows = [
            RowRef(owner, i, len(owner.request.rows[i]))
            for owner in live
            for i in owner.rows_to_run()
        ]
        if not rows:
            return []
        seen = QueuedRows([r.num_tokens for r in rows], [r.owner.arrived_at for r in rows])
        if max(seen.num_tokens) > self.layout.longest_row:
            rows = self._without_too_long(rows, self.layout.longest_row)
            if not rows:
                return []
            seen = QueuedRows([r.num_tokens for r in rows], [r.owner.arrived_at for r in rows])
        layout: PlanLayout = self._step_cap or self.layout
        decision = self.policy.plan(seen, now, layout, self.cost)
        self._report_plan(seen.num_tokens, decision.groups)
        if decision.waiting:
            self.settle()  # nothing goes back in the queue while rows are in flight
            self._requeue(rows, decision.waiting, decision.wake_at)
        forwards = [self._forward(t, [rows[i] for i in members]) for t, members in decision.groups]
        riders = self._take_riders(forwards, layout)
        if riders:
            forwards = self._ride(forwards, riders, layout)
        # clients sharing the step: a forward holding a row of a client with few rows in it runs
        # first (a light client's row waits for no heavy one's rows); then oldest first
        per_client: Counter[str] = Counter()
        for owner in (*live, *riders):
            per_client[owner.request.client] += owner.remaining
        shared = len(per_client) > 1
        return sorted(
            forwards,
            key=lambda f: (
                min(per_client[r.owner.request.client] for r in f.rows) if shared else 0,
                f.oldest_arrival,
                f.rows[0].index,
            ),
        )

    def _without_too_long(self, rows: list[RowRef], longest: int) -> list[RowRef]:
        """The rows of requests whose every row the engine takes; the others fail now, alone
        (their fronts decode to the model's limit: a longer row is a disagreement between the
        two, and no forward could run it)."""
        refused: set[int] = set()
        for row in rows:
            if row.num_tokens > longest and id(row.owner) not in refused:
                refused.add(id(row.owner))
                self._finish(
                    row.owner,
                    ServeError(
                        Reason.TOO_LONG,
                        f"row {row.index} has {row.num_tokens} tokens; the engine takes at most "
                        f"{longest}",
                    ),
                )
        return [row for row in rows if id(row.owner) not in refused]

    def _cap_for(self, priority: int) -> BudgetLayout | None:
        """The capped layout (``ServiceClasses.wait_s`` a forward) for a step of ``priority``
        while a higher class waits or was seen recently; None otherwise. Under the lock."""
        if priority == 1 or self._seconds_per_unit is None:
            return None
        recent = self.clock() - self.classes.recent_s
        higher = self._queue.higher_than(priority)
        if not (higher or any(seen >= recent for seen in self._seen_at[: priority - 1])):
            return None
        capped = capped_layout(self.layout, self.cost, self.classes.wait_s, self._seconds_per_unit)
        if all(capped.max_rows(t) >= self.layout.max_rows(t) for t in self.layout.lengths):
            return None  # every forward is shorter than the cap: the step plans as uncapped
        return capped

    def _take_riders(self, forwards: list[Forward], layout: PlanLayout) -> list[Admitted]:
        """The next class's requests with rows that would ride in ``forwards``. From the rows
        that class has queued at each length (``FairQueue.measured``), each forward's length to
        run at, its own or longer, and the rows it would take there (``_fill``); then requests
        with rows of those lengths until they hold that many in all (passing over requests with
        none: a line's head that cannot ride never blocks those behind it). None unless the
        step serves the highest class waiting."""
        self._ride_at = [f.padded_length for f in forwards]
        if not (self._step_is_top and self.policy.riders):
            return []
        with self._cond:
            # the step's one forward, none of its class left queued to wait it too
            alone = len(forwards) == 1 and self._queue.lines[self._step_priority - 1].rows == 0
            line = self._queue.below(self._step_priority)
            if line is None or line.measured is None:
                return []
            queued = dict(zip(self.layout.lengths, map(int, line.measured), strict=False))
            class_rows = line.rows
        # a rider's share of the forward it would run in otherwise: one of its length, as full
        # as its class's rows make it (a flood's rows run in full forwards)
        self._shares = {}
        for t in queued:
            sharing = max(1, min(self.layout.max_rows(t), class_rows))
            self._shares[t] = self._costs_at(t)[0][sharing] / sharing
        self._budgets = [self._rider_budget(f, alone) for f in forwards]
        wanted: Counter[int] = Counter()
        for k, f in enumerate(forwards):
            most = self._budgets[k]
            _, self._ride_at[k], counts = self._best_fill(
                f, queued, layout, self._raises(f, layout, most), most
            )
            for t, n in counts.items():
                queued[t] -= n
            wanted += counts
        if not wanted:
            return []
        marked = np.zeros(max(wanted) + 2, dtype=bool)  # the token counts of those lengths
        for below, t in itertools.pairwise((0, *self.layout.lengths)):
            marked[below + 1 : t + 1] = t in wanted
        longest = self.layout.longest_row

        def useful(owner: Admitted) -> int:
            return owner.rows_marked(marked, longest)

        with self._cond:
            _, riders = self._queue.take_rows(self._step_priority, wanted.total(), useful)
            self.metrics.queue_depth(len(self._queue))
        riders.sort(key=lambda owner: owner.arrival)
        self._riders = riders
        return self.admit(riders)

    def _costs_at(self, length: int) -> tuple[list[float], list[float]]:
        """A forward's cost at ``length`` by its rows, up to the batch the most rows there run
        as; and by the rows it holds, 0 to the most, as the engine runs it: at the next captured
        batch size, where it captured any (CUDA graphs). Made once a length."""
        costs = self._cost_rows.get(length)
        if costs is None:
            most = self.layout.max_rows(length)
            # (a server's max_batch between captured sizes runs as the next one, past it)
            row = cost_row(self.cost, length, self.layout.run_batch_size(length, most)).tolist()
            runs = [
                row[self.layout.run_batch_size(length, n)] if n else 0.0 for n in range(most + 1)
            ]
            costs = self._cost_rows[length] = (row, runs)
        return costs

    def _runs_cost(self, rows: int, length: int) -> float:
        """What a forward of ``rows`` rows at ``length`` costs as the engine runs it."""
        return self._costs_at(length)[1][rows]

    def _raises(self, forward: Forward, layout: PlanLayout, most: float) -> list[int]:
        """The lengths ``forward`` may run at to take riders: its own, and each longer bucket
        where one more row keeps it within its rider budget ``most`` (its own rows padded
        further, riders of that length none)."""
        held, length = len(forward.rows), forward.padded_length
        return [length] + [
            t
            for t in self.layout.lengths
            if t > length and layout.max_rows(t) > held and self._runs_cost(held + 1, t) <= most
        ]

    def _rider_budget(self, forward: Forward, alone: bool) -> float:
        """The most ``forward`` may cost with riders, in cost units. A higher class's row may wait
        about one capped forward for a lower class (``ServiceClasses.wait_s``, at most the
        longest forward): for one running as it came, or for riders in its own. Riders take
        ``rider_factor`` times its rows' cost or, where they have waited less (``alone``: the
        step's one forward, none of its class left queued to wait it too; the engine
        measured), what they have not, whichever is more: it ends by their arrival plus a
        capped forward plus their own cost, and runs no longer than a capped forward, so a
        row coming meanwhile waits one at most. With overlap, what is left of the forward in
        flight counts as waited (its cost at the measured seconds per unit). (The spare wait
        on top of the factor's riders keeps the bulk fuller where a forward's fixed cost is
        large, but puts the interactive p99 at its bound where a row's own forward is most of
        its latency: the simulated A30 at 2 ms.)"""
        own = self._runs_cost(len(forward.rows), forward.padded_length)
        most = self.classes.rider_factor * own
        spu = self._seconds_per_unit
        if not spu or not alone:
            return most
        longest = self.layout.lengths[-1]
        full = self._runs_cost(self.layout.max_rows(longest), longest)
        capped = min(self.classes.wait_s / spu, full)
        now = self.clock()
        waited = (now - forward.oldest_arrived_at) / spu
        flying = self.runner.in_flight
        if flying is not None and not self.runner.ran:
            length = flying.padded_length
            flying_cost = self.cost.cost(
                self.layout.run_batch_size(length, len(flying.rows)), length
            )
            waited += max(0.0, flying_cost - (now - self._submitted_at) / spu)
        return max(most, min(capped, capped + own - waited))

    def _best_fill(
        self,
        forward: Forward,
        rows: Mapping[int, int],
        layout: PlanLayout,
        lengths: list[int],
        most: float,
    ) -> tuple[float, int, Counter[int]]:
        """Of ``_fill`` at each of ``lengths``, the one saving most; none where none saves."""
        none: tuple[float, int, Counter[int]] = (0.0, forward.padded_length, Counter())
        fills = [none] + [self._fill(forward, t, rows, layout, most) for t in lengths]
        return max(fills, key=lambda fill: fill[0])

    def _fill(
        self,
        forward: Forward,
        length: int,
        rows: Mapping[int, int],
        layout: PlanLayout,
        most: float,
    ) -> tuple[float, int, Counter[int]]:
        """The riders ``forward`` takes run at ``length``, of ``rows`` (how many at each bucket
        length): those of the longest lengths first, each where its tokens there cost less than
        its share of a forward of its own (``_shares``), while the forward, as it runs
        (``_runs_cost``), stays within its rider budget ``most`` (``_rider_budget``) and the
        rows the layout takes; as many as save most (their shares, less what the forward costs more:
        a captured batch size passed may cost more than the rows past it save). Returns that
        saving, ``length``, and how many of each length it takes."""
        held = len(forward.rows)
        before = self._runs_cost(held, forward.padded_length)
        room = layout.max_rows(length)
        cost, runs = self._costs_at(length)
        order: list[int] = []  # the lengths of the rows taken, in turn
        work = best = 0.0
        best_rows, n = 0, held
        for alone in sorted((t for t in rows if t <= length and t in self._shares), reverse=True):
            share = self._shares[alone]
            for _ in range(rows[alone]):
                if n >= room or runs[n + 1] > most or cost[n + 1] - cost[n] >= share:
                    break
                n, work = n + 1, work + share
                order.append(alone)
                saving = work - (runs[n] - before)
                if saving > best:
                    best, best_rows = saving, len(order)
        return best, length, Counter(order[:best_rows])

    def _ride(
        self, forwards: list[Forward], riders: list[Admitted], layout: PlanLayout
    ) -> list[Forward]:
        """``forwards`` with the riders' rows added: each forward takes what ``_fill`` takes of
        the riders' rows, at its own length or the one ``_take_riders`` chose, whichever saves
        more of the rows there are. A rider with none placed is queued again now, one with some
        placed once no row of it is in flight (``_partial``)."""
        pool: dict[int, list[RowRef]] = {}  # the riders' rows by the bucket they run at alone
        for owner in riders:
            for i in owner.rows_to_run():
                row = RowRef(owner, i, len(owner.request.rows[i]))
                alone = self.layout.pad_len(row.num_tokens)
                if alone in self._shares:  # (a longer row runs in its own class's step)
                    pool.setdefault(alone, []).append(row)
        ridden: list[Forward] = []
        for f, length, most in zip(forwards, self._ride_at, self._budgets, strict=True):
            available = {t: len(rows) for t, rows in pool.items()}
            lengths = sorted({f.padded_length, length})
            _, length, counts = self._best_fill(f, available, layout, lengths, most)
            if not counts:
                ridden.append(f)
                continue
            more = [row for t, n in counts.items() for row in pool[t][:n]]
            for t, n in counts.items():
                del pool[t][:n]
            ridden.append(
                Forward(length, f.rows + tuple(more), f.oldest_arrival, f.oldest_arrived_at)
            )
        placed = Counter(id(row.owner) for f in ridden for row in f.rows)
        back = [owner for owner in riders if not placed[id(owner)]]
        self._partial = [o for o in riders if 0 < placed[id(o)] < o.remaining]
        if back:
            with self._cond:
                self._queue_again(back)
                self._cond.notify()
        return ridden

    def _account(self, forward: Forward, seconds: float) -> None:
        """A forward's cost, shared between its rows' classes; and the engine's seconds per
        cost unit, the cap's measure."""
        units = self.cost.cost(len(forward.rows), forward.padded_length)
        if units <= 0:
            return
        measured = seconds / units
        previous = self._seconds_per_unit
        self._seconds_per_unit = measured if previous is None else 0.8 * previous + 0.2 * measured
        self._decay_served()
        share = units / len(forward.rows)
        for row in forward.rows:
            self._served[row.owner.request.priority - 1] += share

    def run(self, forward: Forward, yields: bool = False) -> Forward | None:
        """Runs one planned forward and completes it; on failure, splits it and runs the parts.
        With ``overlap``, it is padded while the one before it runs, and the one before it is
        completed while it runs: it completes by the next ``run`` or ``settle``. With
        ``yields``, it does not start where a class above the step's comes before the one
        before it has run (None: that class is planned while it runs, and runs next) or waits
        once it has (None; the one before is completed). Without, a higher class waiting when
        it starts rides in it where it fits (``_carry_latecomers``). Returns the forward as run."""
        inputs = self._inputs(forward)
        if yields and self._outranked_while_running():
            return None
        before = self._unsettled = self.runner.wait()
        if before is not None and before.settled_first:
            self._settle_flown(before)  # its parts first, one at a time, before anything else
            before = None
        if yields and self._outranked():
            if before is not None:
                self._settle_flown(before)
            return None
        forward, inputs = self._carry_latecomers(forward, inputs)
        # the hand-off: rows cancelled or past their deadline are dropped before their forward
        kept = self._started(forward)
        if kept.rows:
            self._submitted_at = self.clock()
            ran = self.runner.submit(kept, *(inputs if kept is forward else self._inputs(kept)))
            if ran is not None:
                self._settle(ran)
        if before is not None:
            self._settle_flown(before)  # while the next one runs
        return forward

    def _carry_latecomers(
        self, forward: Forward, inputs: tuple[np.ndarray, np.ndarray]
    ) -> tuple[Forward, tuple[np.ndarray, np.ndarray]]:
        """``forward`` and its inputs with the requests that came while the forward before it
        ran, of the highest class waiting where that is above its step's, each where every row
        of it fits its length, or the longer one ``_carrying_length`` finds cheaper (the first
        of the clients in turn): they would wait for it anyway, and a forward of their own
        after it would cost its fixed cost again. In a step
        of the highest class waiting, at most all but one of the rows its layout takes there
        (capped: about ``wait_s``), its last rows making room where it is full (their requests
        queued again once no row of theirs is in flight: ``_partial``); in a step serving a
        starved class (``_pick``), only the room it has left."""
        if self._step_priority == 1 or not self.policy.riders:  # (a peer's: never carries)
            return forward, inputs
        length = forward.padded_length
        layout = self._step_cap or self.layout
        with self._cond:
            waiting = self._queue.waiting()
            if not waiting or waiting[0] >= self._step_priority:
                return forward, inputs
            if self._step_is_top:
                length = self._carrying_length(forward, self._queue.lines[waiting[0] - 1])
            most = layout.max_rows(length)
            room = most - 1 if self._step_is_top else most - len(forward.rows)
            if room <= 0:
                return forward, inputs
            marked = np.zeros(length + 2, dtype=bool)
            marked[: length + 1] = True  # the token counts this forward's length holds
            longest = self.layout.longest_row

            def fits(owner: Admitted) -> int:
                nonlocal room
                rows = owner.rows_marked(marked, longest)
                if not 0 < rows == owner.remaining <= room:
                    return 0
                room -= rows
                return rows

            _, taken = self._queue.take_rows(waiting[0] - 1, room, fits)
            if taken:
                self.metrics.queue_depth(len(self._queue))
        if not taken:
            return forward, inputs
        taken.sort(key=lambda owner: owner.arrival)
        self._riders += taken  # answered with the step's if it fails before they run
        more = [
            RowRef(owner, i, len(owner.request.rows[i]))
            for owner in self.admit(taken)
            for i in owner.rows_to_run()
        ]
        if not more:
            return forward, inputs
        # raised: at the length the rows carried need (a longer request may not have come along)
        length = max(forward.padded_length, *(self.layout.pad_len(row.num_tokens) for row in more))
        most = layout.max_rows(length)
        keep = min(len(forward.rows), most - len(more))
        self._partial += list({id(row.owner): row.owner for row in forward.rows[keep:]}.values())
        if length > forward.padded_length:  # its rows padded further
            inputs = pad_rows([row.ids for row in forward.rows[:keep]], length, self.pad_token_id)
        ids, mask = pad_rows([row.ids for row in more], length, self.pad_token_id)
        carried = Forward(
            length,
            forward.rows[:keep] + tuple(more),
            forward.oldest_arrival,
            forward.oldest_arrived_at,
        )
        return carried, (
            np.concatenate([inputs[0][:keep], ids]),
            np.concatenate([inputs[1][:keep], mask]),
        )

    def _carrying_length(self, forward: Forward, line: FairQueue[Admitted]) -> int:
        """The length ``forward`` carries the higher class's ``line`` at: its own, or the
        longest bucket that class's rows need, where running it there with them all costs less
        than carrying those that fit its length and running the others in a forward of their
        own after it (the rows it leaves to make room run later, each at its share of a full
        forward). Under the lock."""
        length, lengths = forward.padded_length, self.layout.lengths
        if line.measured is None or length > lengths[-1]:
            return length
        counts = line.measured[: len(lengths)]
        needed = np.flatnonzero(counts)
        if not needed.size or lengths[needed[-1]] <= length:
            return length
        raised, layout = lengths[needed[-1]], self._step_cap or self.layout
        fitting = bisect.bisect_right(lengths, length)
        short, longer = int(counts[:fitting].sum()), int(counts[fitting:].sum())
        full = self.layout.max_rows(length)
        share = self._runs_cost(full, length) / full

        def carrying(rows: int, at: int) -> float:
            """The forward at ``at`` with ``rows`` carried, and the rows it leaves."""
            most = layout.max_rows(at)
            carried = min(rows, most - 1)
            kept = min(len(forward.rows), most - carried)
            return self._runs_cost(kept + carried, at) + (len(forward.rows) - kept) * share

        planned = carrying(short, length) + self._runs_cost(
            min(longer, self.layout.max_rows(raised)), raised
        )
        return raised if carrying(short + longer, raised) <= planned else length

    def _outranked_while_running(self) -> bool:
        """Waits until the forward in flight has run or a class above the step's has rows
        queued, whichever comes first: True for the second (the forward still runs)."""
        with self._cond:
            self.runner.wait_until(self._cond, lambda: self._queue.higher_than(self._step_priority))
            return not self.runner.ran

    def _ran_one(self) -> None:
        """The engine thread's word that the forward in flight has run."""
        with self._cond:
            self._cond.notify_all()

    def _run_alone(self, forward: Forward) -> None:
        """Runs a forward now and completes it (the parts of one that failed, a row again)."""
        kept = self._started(forward)
        if kept.rows:
            self._settle(self.runner.run_now(kept, *self._inputs(kept)))

    def _inputs(self, forward: Forward) -> tuple[np.ndarray, np.ndarray]:
        """The forward's token ids padded to its length, and their attention mask."""
        return pad_rows([row.ids for row in forward.rows], forward.padded_length, self.pad_token_id)

    def _started(self, forward: Forward) -> Forward:
        """The forward without rows no longer wanted, its requests marked started."""
        kept = self._without_unwanted(forward)
        now = self.clock()
        for row in kept.rows:
            if row.owner.started_at is None:
                row.owner.started_at = now
        return kept

    def settle(self) -> None:
        """Completes the forward in flight (``overlap``), if any: waits for it."""
        ran = self.runner.wait()
        if ran is not None:
            self._settle_flown(ran)

    def _settle(self, ran: Ran) -> None:
        if ran.error is not None:
            self._split_and_retry(ran.forward, ran.error)
            return
        assert ran.outputs is not None
        forward = ran.forward
        real_tokens = sum(row.num_tokens for row in forward.rows)
        self.metrics.forward(forward.padded_length, len(forward.rows), real_tokens, ran.seconds)
        self._account(forward, ran.seconds)
        self.metrics.flush_if_due()
        self.complete(forward, ran.outputs, ran.finite)

    def _settle_flown(self, ran: Ran) -> None:
        """Completes the forward that was in flight; then the requests held for it are queued
        again (``_held``)."""
        self._unsettled = ran  # until it is: an error meanwhile still completes it
        self._settle(ran)
        self._unsettled = None
        self._requeue_held()

    def _requeue_held(self) -> None:
        if self._held:
            with self._cond:
                self._queue_again(self._held)
                self._held = []
                self._cond.notify()

    def _settle_after_error(self, err: Exception) -> None:
        """After an internal error: the forward that had run and was being completed, and the
        one in flight (this step's or the one before's), still complete; where that fails too,
        their requests are answered by the error. Then the requests held for them go back."""
        pending = [ran for ran in (self._unsettled, self.runner.wait()) if ran is not None]
        self._unsettled = None
        for ran in pending:
            try:
                self._settle(ran)
            except Exception:
                for row in ran.forward.rows:
                    self._finish(
                        row.owner,
                        ServeError(Reason.INTERNAL, f"internal scheduler error: {err!r}"),
                    )
        self._requeue_held()  # those answered by the error stay out

    def complete(
        self, forward: Forward, outputs: np.ndarray, finite: np.ndarray | None = None
    ) -> None:
        """Scatters a forward's outputs to their requests; answers each one now complete. A row
        whose output is not finite (``finite``: which are, when known) is never answered from
        it: run once more alone, then, if it is still not finite, its request fails
        (NON_FINITE). The engine is idle here."""
        width = outputs.shape[1]
        finite = finite_rows(outputs) if finite is None else finite
        again: list[RowRef] = []
        if not finite.all():
            again = [row for row, ok in zip(forward.rows, finite.tolist(), strict=True) if not ok]
            skipped = {id(row) for row in again}
        for row, values in zip(forward.rows, outputs, strict=True):
            owner = row.owner
            if owner.done or (again and id(row) in skipped):
                continue
            if owner.outputs is None:
                owner.outputs = np.empty((len(owner.request.rows), width), np.float32)
                owner.computed = bytearray(len(owner.request.rows))
            assert owner.computed is not None
            owner.outputs[row.index] = values
            owner.computed[row.index] = 1
            owner.remaining -= 1
            if owner.remaining == 0:
                tokens = np.fromiter(map(len, owner.request.rows), np.int32)
                started = owner.started_at if owner.started_at is not None else owner.arrived_at
                queue_s, inference_s = started - owner.arrived_at, self.clock() - started
                self.metrics.answered(
                    queue_s, inference_s, owner.request.priority, len(owner.request.rows)
                )
                self._finish(owner, Answer(owner.outputs, tokens, queue_s, inference_s))
        if again:
            self._non_finite(forward, again)

    def _non_finite(self, forward: Forward, rows: list[RowRef]) -> None:
        where = f"a forward of {len(forward.rows)} rows at length {forward.padded_length}"
        self.log(f"{len(rows)} row(s) of {where} came out NaN or infinite")
        if len(forward.rows) == 1:
            (row,) = rows
            self._finish(
                row.owner,
                ServeError(
                    Reason.NON_FINITE,
                    f"row {row.index} ({row.num_tokens} tokens): the model's output is NaN or "
                    "infinite, even computed alone",
                ),
            )
            return
        for row in rows:
            self._run_alone(self._forward(self.layout.pad_len(row.num_tokens), [row]))

    # -- the serving thread: a loop around step -------------------------------------------------

    def start(self, responder: bool = True) -> None:
        """Starts the scheduler thread, and the responder thread unless ``responder`` is False
        (for a ``respond`` that only hands the answer on, like the queue owner's)."""
        if responder:
            self._outbox = queue.SimpleQueue()
            self._responder = threading.Thread(
                target=self._send_loop, name="responder", daemon=True
            )
            self._responder.start()
        self._thread = threading.Thread(target=self._loop, name="batch-scheduler", daemon=True)
        self._thread.start()

    @property
    def overlaps(self) -> bool:
        """Whether forwards run on an engine thread, one ahead (``overlap``)."""
        return self.runner.overlaps

    @property
    def thread_id(self) -> int | None:
        """The scheduler thread's id in the OS (its CPU is what runs between forwards), once
        started."""
        return self._thread.native_id if self._thread is not None else None

    def stop(self, timeout_s: float = 30.0) -> bool:
        """Stops accepting, finishes what is queued (up to ``timeout_s``), answers the rest.

        Returns False when the scheduler thread or the responder was still running at the
        timeout (a forward that does not end): the caller must not close the engine then."""
        with self._cond:
            self._accepting = False
            self._stop = True
            self._cond.notify()
        deadline = time.monotonic() + timeout_s
        if self._thread is not None:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        while True:  # every class and client, round after round
            taken = self.take()
            if not taken:
                break
            for owner in taken:
                self._finish(
                    owner,
                    ServeError(Reason.SHUTDOWN, "the server shut down before this request ran"),
                )
        with self._outbox_lock:  # from here on, answers are sent by whoever decides them
            outbox, self._outbox = self._outbox, None
            if outbox is not None:
                outbox.put(None)  # after every answer queued before it
        if self._responder is not None:
            self._responder.join(max(0.0, deadline - time.monotonic()))
        if not (self._thread is not None and self._thread.is_alive()):
            self.runner.close()
        return not (
            (self._thread is not None and self._thread.is_alive())
            or (self._responder is not None and self._responder.is_alive())
        )

    def _loop(self) -> None:
        while True:
            if self.runner.in_flight is not None:
                with self._cond:
                    idle = not self._queue
                if idle:  # nothing to plan while it runs: its answers go now
                    self._settle_safely()
            with self._cond:
                if not self._queue and not self._stop:
                    # idle: wake now and then, so metrics recorded meanwhile (refusals in
                    # execute) are published even when no forward runs
                    self._cond.wait(timeout=self._idle_wait_s())
                has_work = bool(self._queue) and (
                    self._wake_at is None or self._stop or self.clock() >= self._wake_at
                )
                stopping = self._stop
            if has_work:
                self.step(finish_last=False)
                continue
            self._settle_safely()  # before stopping, or sleeping until a waiting policy is due
            # outside the lock, so submit never waits on it; when due only, so a request
            # arriving right after a forward does not wait on a flush either
            if stopping and not self._queue:
                self.metrics.flush()
                return
            self.metrics.flush_if_due()
            if self._queue and not stopping:  # a waiting policy's rows: sleep until due
                with self._cond:
                    self._cond.wait(timeout=self._idle_wait_s())

    def _settle_safely(self) -> None:
        """``settle`` for the loop: an internal error answers what it concerns, as in a step,
        and never ends the thread."""
        try:
            self.settle()
        except Exception as err:
            self._settle_after_error(err)

    def _idle_wait_s(self) -> float:
        if self._wake_at is None:
            return IDLE_WAKE_S
        return max(0.0, min(IDLE_WAKE_S, self._wake_at - self.clock()))

    def _send_loop(self) -> None:
        outbox = self._outbox
        assert outbox is not None
        while True:
            item = outbox.get()
            if item is None:
                return
            owner, outcome = item
            self._send(owner, outcome)

    # -- answering --------------------------------------------------------------------------------

    def _finish(self, owner: Admitted, outcome: Outcome) -> None:
        """Answers a request once: through the responder thread while it runs, else here. Every
        refusal is counted here, once, by its reason."""
        if not owner.claim():
            return
        if isinstance(outcome, ServeError):
            self.metrics.refused(outcome.reason, owner.request.priority)
        with self._outbox_lock:
            if self._outbox is not None:
                self._outbox.put((owner, outcome))
                return
        self._send(owner, outcome)

    @staticmethod
    def _send(owner: Admitted, outcome: Outcome) -> None:
        try:
            owner.request.respond(outcome)
        except Exception:  # the client's connection is gone: nothing left to tell it
            return

    # -- helpers of the step ---------------------------------------------------------------------

    def _still_wanted(self, owner: Admitted) -> bool:
        """False (after answering it) for a request that is done, cancelled or past its deadline."""
        if owner.done:
            return False
        deadline = owner.request.deadline
        if deadline is not None and self.clock() > deadline:
            self._finish(
                owner, ServeError(Reason.TIMEOUT, "deadline exceeded before the request ran")
            )
            return False
        if owner.request.is_cancelled():
            self._finish(owner, ServeError(Reason.CANCELLED, "the client cancelled the request"))
            return False
        return True

    def _without_unwanted(self, forward: Forward) -> Forward:
        """The forward without rows of requests answered, cancelled or expired meanwhile; asked
        once per request, not per row (is_cancelled is a message to the server)."""
        wanted: dict[int, bool] = {}
        for row in forward.rows:
            key = id(row.owner)
            if key not in wanted:
                wanted[key] = self._still_wanted(row.owner)
        kept = [row for row in forward.rows if wanted[id(row.owner)]]
        if len(kept) == len(forward.rows):
            return forward
        return (
            self._forward(forward.padded_length, kept)
            if kept
            else Forward(
                forward.padded_length, (), forward.oldest_arrival, forward.oldest_arrived_at
            )
        )

    @staticmethod
    def _forward(padded_length: int, rows: list[RowRef]) -> Forward:
        """A forward of rows in arrival order (as planners return them): the first is the oldest."""
        oldest = rows[0].owner
        return Forward(padded_length, tuple(rows), oldest.arrival, oldest.arrived_at)

    def _report_plan(self, lengths: list[int], groups: list[Group]) -> None:
        """The plan's cost beside per-bucket grouping's (a metric of what planning gains)."""
        baseline = per_bucket_cost(lengths, self.layout, self.cost)
        self.metrics.plan(plan_cost(groups, self.cost), baseline)

    def _requeue(self, rows: list[RowRef], waiting: list[int], wake_at: float | None) -> None:
        with self._cond:
            self._queue_again(rows[i].owner for i in waiting)
            self._wake_at = wake_at

    def _queue_again(self, owners: Iterable[Admitted]) -> None:
        """Requests a step took and did not finish, oldest first, back at the head of their
        clients' lines with the rows they have left (``Admitted.computed``); under the lock."""
        unique = {id(o): o for o in owners if not o.done}
        back = sorted(unique.values(), key=lambda o: o.arrival)
        self._queue.push_front((o.request.priority, o.request.client, o, o.remaining) for o in back)

    def _newcomer(self, clients: frozenset[str]) -> bool:
        with self._cond:
            return self._queue.has_client_besides(self._step_priority, clients)

    def _outranked(self) -> bool:
        """Whether a class above the step's now has rows waiting."""
        with self._cond:
            return self._queue.higher_than(self._step_priority)

    def _requeue_forwards(self, forwards: list[Forward]) -> None:
        """The requests with rows in ``forwards`` (not run) back in the queue, and the riders
        with rows left (``_partial``); those with a row in the forward in flight once it has
        completed (``_held``)."""
        owners = [row.owner for forward in forwards for row in forward.rows] + self._partial
        self._partial = []
        flying = self.runner.in_flight
        if flying is not None:
            running = {id(row.owner) for row in flying.rows}
            self._held += [owner for owner in owners if id(owner) in running]
            owners = [owner for owner in owners if id(owner) not in running]
        with self._cond:
            self._queue_again(owners)
            self.metrics.queue_depth(len(self._queue))
            self._cond.notify()

    def _split_and_retry(self, forward: Forward, err: Exception) -> None:
        if len(forward.rows) == 1:
            row = forward.rows[0]
            self._finish(
                row.owner,
                ServeError(
                    Reason.FORWARD_FAILED,
                    f"row {row.index} ({row.num_tokens} tokens) failed even alone: "
                    f"{type(err).__name__}: {err}",
                ),
            )
            return
        self.metrics.split(forward.padded_length, len(forward.rows))
        # a budget strictly below what failed: long rows split off, short ones stay together
        budget = max(1, (len(forward.rows) * forward.padded_length) // 2)
        lengths = [row.num_tokens for row in forward.rows]
        parts = self.policy.regroup(lengths, BudgetLayout(self.layout, budget), self.cost)
        if len(parts) == 1:  # cannot happen (the budget shrank), but never loop on it
            parts = [(forward.padded_length, [i]) for i in range(len(forward.rows))]
        for padded_length, members in parts:
            self._run_alone(self._forward(padded_length, [forward.rows[i] for i in members]))
