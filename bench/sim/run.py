"""The simulation: the project's scheduler stepped on a virtual clock over an engine that only
moves the clock by a cost table's time; closed or open loop; the highest rate under an SLO."""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from bench.cost_tables import CostTable
from bench.sim.policies import make_policy
from python_backend.common.cost_models import LinearCost
from python_backend.engines.base import BucketLayout
from python_backend.scheduling.policy import ServiceClasses
from python_backend.scheduling.records import Answer, Forward, Request
from python_backend.scheduling.runners import Ran, Runner
from python_backend.scheduling.scheduler import Scheduler

# -- the simulation -----------------------------------------------------------------------------


@dataclass
class VirtualClock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


class TimedEngine:
    """Computes nothing: a forward moves the virtual clock by the table's time for its shape,
    plus the server's own time per row. Outputs are NaN: never real."""

    output_name, output_dim = "EMBEDDING", 1

    def __init__(
        self,
        layout: BucketLayout,
        table: CostTable,
        clock: VirtualClock,
        server_s_per_row: float,
        arrive: Callable[[], None] = lambda: None,
    ) -> None:
        self.layout, self.table, self.clock = layout, table, clock
        self.server_s_per_row = server_s_per_row
        self.arrive = arrive  # submits the requests that arrived while a forward ran
        # (rows, padded length, real tokens, when it finished, how long it took)
        self.forwards: list[tuple[int, int, int, float, float]] = []

    def seconds(self, rows: int, length: int) -> float:
        """How long a forward of this shape takes."""
        if rows > self.layout.max_rows(length):
            raise ValueError(f"{rows} rows at {length} tokens: more than the layout's cap")
        ran = self.layout.run_batch_size(length, rows)  # a captured size, where graphs exist
        return self.table.seconds(ran, length) + rows * self.server_s_per_row

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        rows, length = input_ids.shape
        took = self.seconds(rows, length)
        self.clock.now += took
        self.forwards.append((rows, length, int(attention_mask.sum()), self.clock.now, took))
        self.arrive()
        return np.zeros((rows, 1), dtype=np.float32)

    def close(self) -> None:
        pass


class OverlappedTimedRunner(Runner):
    """The served loop's overlap (``overlap_forwards``) on the virtual clock: ``submit`` returns
    at once and the scheduler plans the next step meanwhile, from what had come by then; the
    forward ends at its table time, and waiting for it moves the clock there, the requests
    arriving on the way submitted each at its time (``next_arrival``, ``arrive``)."""

    overlaps = True

    def __init__(self, engine: TimedEngine, next_arrival: Callable[[], float]) -> None:
        self.engine, self.clock, self.next_arrival = engine, engine.clock, next_arrival
        self._flight: tuple[Forward, int, float, float] | None = None  # real tokens, end, took

    @property
    def in_flight(self) -> Forward | None:
        return None if self._flight is None else self._flight[0]

    @property
    def ran(self) -> bool:
        return self._flight is None or self.clock.now >= self._flight[2]

    def submit(self, forward: Forward, ids: np.ndarray, mask: np.ndarray) -> Ran | None:
        assert self._flight is None, "one forward in flight at a time"
        took = self.engine.seconds(*ids.shape)
        self._flight = (forward, int(mask.sum()), self.clock.now + took, took)
        return None

    def wait(self) -> Ran | None:
        if self._flight is None:
            return None
        forward, real, end, took = self._flight
        self._flight = None
        self.clock.now = max(self.clock.now, end)
        self.engine.arrive()
        self.engine.forwards.append((len(forward.rows), forward.padded_length, real, end, took))
        rows = len(forward.rows)
        return Ran(forward, np.zeros((rows, 1), np.float32), None, took, np.ones(rows, bool))

    def wait_until(self, cond: object, other: Callable[[], bool]) -> None:
        """The clock moves from arrival to arrival, each submitted, until ``other`` holds or
        the forward in flight has run."""
        while not (self.ran or other()):
            assert self._flight is not None
            self.clock.now = min(self._flight[2], max(self.clock.now, self.next_arrival()))
            self.engine.arrive()

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Load:
    """Closed-loop clients beside the main load: ``clients`` of them, each sending a request of
    ``rows`` rows as soon as its last is answered, in class ``priority``, named ``client``."""

    clients: int
    rows: int = 1
    priority: int = 1
    client: str = ""


@dataclass
class Result:
    policy: str
    seconds: float  # virtual time measured (after the warm-up)
    latencies_s: list[float] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0
    forwards: int = 0
    rows_per_request: int = 1
    offered_requests: int = 0  # requests that arrived within the measured window
    busy_s: float = 0.0  # the engine's time in forwards within the window (every load's)
    beside: Result | None = None  # the load beside it (``Load``), if any

    @property
    def rows_per_s(self) -> float:
        return len(self.latencies_s) * self.rows_per_request / self.seconds

    @property
    def served_over_offered(self) -> float:
        """Requests answered within the window over those that arrived within it: about 1 where
        the engine keeps up (the queue's backlog the same at both ends), less where it falls behind
        (the backlog grows); the arrivals' own noise cancels out."""
        return len(self.latencies_s) / max(1, self.offered_requests)

    def percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.latencies_s, q) * 1e3) if self.latencies_s else math.nan

    def summary(self) -> dict[str, float]:
        return {
            "rows_per_s": self.rows_per_s,
            "tokens_per_s": self.real_tokens / self.seconds,
            "p50_ms": self.percentile_ms(50),
            "p99_ms": self.percentile_ms(99),
            "padding_efficiency": self.real_tokens / max(1, self.padded_tokens),
            "forwards_per_s": self.forwards / self.seconds,
        }


def simulate(
    lengths: Sequence[int],
    table: CostTable,
    policy: str,
    concurrency: int | None = None,
    rate: float | None = None,
    bursty: bool = False,
    seconds: float = 60.0,
    warmup_s: float = 5.0,
    server_us_per_row: float = 0.0,
    seed: int = 0,
    round_trip_us: float = 0.0,
    rows_per_request: int = 1,
    priority: int = 1,
    client: str = "",
    beside: Load | None = None,
    classes: ServiceClasses | None = None,
    overlap: bool = False,
) -> Result:
    """One run; exactly one of ``concurrency`` (closed loop) and ``rate`` (open loop, rows/s)
    is set. Each request holds ``rows_per_request`` rows, each of its own length; latencies are
    per request. The requests are in class ``priority`` of ``classes`` from client ``client``;
    ``beside``: a second load at the same time (its figures in the result's ``beside``). ``server_us_per_row`` is the server's own time per row at that many rows per
    request (it is mostly per request: `server_time_per_row` measures it at the same size).
    Forwards run on the table's layout: its buckets, its caps, its captured sizes. With
    ``overlap``, as a GPU deployment serves (``overlap_forwards``): each step is planned while
    the forward before it runs (``OverlappedTimedRunner``); without, after it has ended."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency and rate")
    if rows_per_request < 1:
        raise ValueError("rows_per_request must be >= 1")
    clock = VirtualClock()
    layout = table.layout
    engine = TimedEngine(layout, table, clock, server_us_per_row / 1e6, lambda: submit_due())
    arrivals: list[tuple[float, int, int]] = []  # (time, sequence, load)
    runner = OverlappedTimedRunner(engine, lambda: arrivals[0][0] if arrivals else math.inf)
    # the planner's cost model: the table's own fixed cost in tokens, as calibration would find it
    scheduler = Scheduler(
        engine,
        pad_token_id=0,
        cost=LinearCost(table.fixed_tokens),
        max_batch=layout.max_batch,
        max_queue_rows=10**9,
        policy=make_policy(policy),
        clock=clock,
        classes=classes,
        timer=clock,
        runner=runner if overlap else None,
    )
    rng = np.random.default_rng(seed)
    result = Result(policy, seconds, rows_per_request=rows_per_request)
    # the loads: (rows a request, class, client, result)
    loads = [(rows_per_request, priority, client, result)]
    if beside is not None:
        result.beside = Result(policy, seconds, rows_per_request=beside.rows)
        loads.append((beside.rows, beside.priority, beside.client, result.beside))
    sequence = 0

    end = warmup_s + seconds

    def measured(t: float) -> bool:
        """Within the measured window: after the warm-up, and not past its end, where a step
        that started before it (a whole plan's forwards) may still be running."""
        return warmup_s <= t <= end

    def arrive_at(t: float, load: int = 0) -> None:
        nonlocal sequence
        heapq.heappush(arrivals, (t, sequence, load))
        sequence += 1
        if measured(t):
            loads[load][3].offered_requests += 1

    def respond_for(arrived: float, load: int) -> Callable[[object], None]:
        def respond(outcome: object) -> None:
            assert isinstance(outcome, Answer), outcome
            if measured(clock.now):
                loads[load][3].latencies_s.append(clock.now - arrived)
            if concurrency is not None or load > 0:
                # the answer's way out to the client and the next request's way in
                arrive_at(clock.now + round_trip_us / 1e6, load)

        return respond

    for k in range(beside.clients if beside else 0):
        arrive_at(k * 1e-6, 1)
    if concurrency is not None:
        for k in range(concurrency):
            arrive_at(k * 1e-6)
    else:
        assert rate is not None
        t = 0.0
        while t < warmup_s + seconds:
            burst = int(rng.integers(1, 17)) if bursty else 1
            t += rng.exponential(burst * rows_per_request / rate)
            for _ in range(burst):
                arrive_at(t)

    @functools.cache
    def row_of_length(n: int) -> np.ndarray:
        """A row of ``n`` tokens, one array per length shared by every request (read-only: the
        scheduler pads copies): building one per row took a third of a run's time."""
        row = np.ones(n, dtype=np.int64)
        row.setflags(write=False)
        return row

    def submit_due() -> None:
        """Submits every request that has arrived by now, each at its own arrival time."""
        while arrivals and arrivals[0][0] <= clock.now:
            t, _, load = heapq.heappop(arrivals)
            rows, priority, client, _ = loads[load]
            picks = rng.integers(len(lengths), size=rows)
            request_rows = [row_of_length(int(lengths[k])) for k in picks]
            now, clock.now = clock.now, t  # the request's own arrival time
            respond = respond_for(t, load)
            scheduler.submit(Request(request_rows, respond, client=client, priority=priority))
            clock.now = now

    forwards_seen = 0

    def account() -> None:
        nonlocal forwards_seen
        for rows, length, real, finished, took in engine.forwards[forwards_seen:]:
            if measured(finished):
                result.busy_s += took
                result.forwards += 1
                result.real_tokens += real
                result.padded_tokens += rows * length
        forwards_seen = len(engine.forwards)

    while clock.now < end:
        submit_due()
        wake = scheduler.wake_at
        if scheduler.queued_rows and (wake is None or clock.now >= wake):
            # (overlapped, a waiting policy's plan settles the forward in flight first: the
            # clock may pass the time it waits for, and the loop plans again at once)
            now = clock.now
            if (
                not scheduler.step(now, finish_last=not overlap)
                and (scheduler.wake_at or math.inf) <= now
            ):
                raise RuntimeError(f"policy {policy} waits for a time already past")
            account()
            continue
        if overlap and runner.in_flight is not None:  # nothing to plan while it runs
            scheduler.settle()
            account()
            continue
        upcoming = [arrivals[0][0]] if arrivals else []
        if scheduler.queued_rows and wake is not None:
            upcoming.append(wake)
        if not upcoming:
            break
        clock.now = max(clock.now, min(upcoming))
    for *_, each in loads:
        each.seconds = max(1e-9, min(clock.now, end) - warmup_s)
    return result


def best_under_slo(
    lengths: Sequence[int],
    table: CostTable,
    policy: str,
    slo_ms: float,
    server_us_per_row: float,
    requests: int = 2000,
) -> tuple[float, float]:
    """The highest open-loop rate (rows/s) that is served in full with p99 under ``slo_ms``:
    (rate, p99 ms). Each trial simulates about ``requests`` requests."""

    def holds(rate: float) -> tuple[bool, float]:
        r = simulate(
            lengths,
            table,
            policy,
            rate=rate,
            seconds=max(2.0, requests / rate),
            warmup_s=min(5.0, 200 / rate),
            server_us_per_row=server_us_per_row,
        )
        p99 = r.percentile_ms(99)
        return p99 <= slo_ms and r.served_over_offered >= 0.95, p99

    low, high, best = 0.0, 64.0, (0.0, math.nan)
    while high < 1e6:  # double until the SLO breaks
        ok, p99 = holds(high)
        if not ok:
            break
        low, high, best = high, high * 2, (high, p99)
    for _ in range(7):  # then halve the gap: to within 1/128 of the last doubling
        mid = (low + high) / 2
        ok, p99 = holds(mid)
        if ok:
            low, best = mid, (mid, p99)
        else:
            high = mid
    return best
