"""A discrete-event simulation of the server in virtual time, driving the project's own scheduler.

    python -m bench.simulate --lengths bench/data/request_lengths.txt --cost table:a30 \\
        --policy dp --concurrency 64 --seconds 60

What runs is ``python_backend.scheduler.Scheduler`` itself, step by step on a virtual clock,
with an engine that computes nothing: each forward takes the time a cost table gives for its
(rows, padded length), and the clock moves by that much. Requests of one row each
(``--rows-per-request`` for more), their lengths replayed from real text, arrive from
closed-loop clients (``--concurrency``: each sends its next request when its previous one is
answered) or open-loop (``--rate``, Poisson; ``--bursty``: the same mean rate, in bursts).

The server around the engine costs time too: ``--server-us-per-row`` (decoding, tokenizing,
answering, one row's share of a step) is added to each forward, serially, as it is on a machine
whose engine already takes every core. With the CPU table of a built model it is measured, not
guessed, at the same rows per request (``server_time_per_row``; it is mostly a cost per
request, see docs/PERFORMANCE.md); for a GPU table, where the engine runs beside the CPU, the
same value is a lower bound on what the server adds.

Policies (the peers' batchers run as policies inside this project's loop: an approximation of
those servers, which differ in everything else):
- ``dp``: the exact DP planner over the length buckets (the project);
- ``per_bucket``: rows grouped by bucket alone;
- ``dynamic_batcher``: Triton's dynamic batcher: waits up to a max queue delay for a preferred
  batch size, runs the rows in arrival order, each batch padded to its longest row;
- ``token_budget``: a FIFO batcher under a token budget (rows x longest row), as TEI does;
- ``sorted_window``: up to a batch size of rows, sorted by length, each batch padded to its
  longest, as Infinity does.

The last line printed ends with the simulated rows/s.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.cost_tables import (
    PUBLISHED_BERT_BASE_FP16_MS,
    CostTable,
    cost_table,
    gpu_table,
    linear_table,
    manifest_table,
    read_lengths,
    scaled_table,
)
from bench.docs import write_section
from bench.errors import BenchError, reports_errors
from bench.paths import LENGTHS, ROOT
from python_backend.cost_models import CostModel, LinearCost
from python_backend.engines.base import BucketLayout
from python_backend.planner import PLANNERS, Group, PlanLayout
from python_backend.scheduler import Answer, Policy, PolicyPlan, QueuedRows, Request, Scheduler

# -- the peers' batchers, as policies in this project's loop ------------------------------------


def padded_to_longest(lengths: Sequence[int], members: list[int]) -> Group:
    return max(lengths[i] for i in members), members


class PeerBatcher(Policy):
    """What the peers' batchers share: batches padded to their longest row, and a failed batch
    retried row by row at each row's own length."""

    def regroup(self, lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> list[Group]:
        return [padded_to_longest(lengths, [i]) for i in range(len(lengths))]


class DynamicBatcher(PeerBatcher):
    """Triton's dynamic batcher: a batch leaves when it reaches the preferred size or its oldest
    row has waited ``max_delay_s``; rows in arrival order, padded to the batch's longest."""

    def __init__(self, max_batch: int = 64, max_delay_s: float = 0.002) -> None:
        super().__init__(PLANNERS["per_bucket"], "dynamic_batcher")
        self.max_batch, self.max_delay_s = max_batch, max_delay_s

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        due = min(rows.arrived_at) + self.max_delay_s
        if len(rows) < self.max_batch and now < due:
            return PolicyPlan([], list(range(len(rows))), due)
        order = list(range(len(rows)))
        groups = [
            padded_to_longest(rows.num_tokens, order[a : a + self.max_batch])
            for a in range(0, len(order), self.max_batch)
        ]
        return PolicyPlan(groups)


class TokenBudget(PeerBatcher):
    """FIFO batches under a token budget counted as rows x longest row (TEI's max_batch_tokens)."""

    def __init__(self, max_tokens: int = 16384, max_batch: int = 64) -> None:
        super().__init__(PLANNERS["per_bucket"], "token_budget")
        self.max_tokens, self.max_batch = max_tokens, max_batch

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        groups: list[Group] = []
        members: list[int] = []
        longest = 0
        for i, n in enumerate(rows.num_tokens):
            grown = max(longest, n)
            if members and (
                grown * (len(members) + 1) > self.max_tokens or len(members) >= self.max_batch
            ):
                groups.append(padded_to_longest(rows.num_tokens, members))
                members, grown = [], n
            members.append(i)
            longest = grown
        if members:
            groups.append(padded_to_longest(rows.num_tokens, members))
        return PolicyPlan(groups)


class SortedWindow(PeerBatcher):
    """Up to ``batch_size`` rows at a time, sorted by length, each batch padded to its longest
    (Infinity's batch handler)."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(PLANNERS["per_bucket"], "sorted_window")
        self.batch_size = batch_size

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        order = sorted(range(len(rows)), key=lambda i: rows.num_tokens[i])
        groups = [
            padded_to_longest(rows.num_tokens, sorted(order[a : a + self.batch_size]))
            for a in range(0, len(order), self.batch_size)
        ]
        return PolicyPlan(groups)


class BoundedWait(Policy):
    """The DP planner, but while fewer than ``min_rows`` rows are queued it waits, at most
    ``max_wait_s`` past the oldest row's arrival, for a fuller collection."""

    def __init__(self, max_wait_s: float, min_rows: int = 32) -> None:
        super().__init__(PLANNERS["dp"], f"dp_wait:{max_wait_s * 1e3:g}")
        self.max_wait_s, self.min_rows = max_wait_s, min_rows

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        due = min(rows.arrived_at) + self.max_wait_s
        if len(rows) < self.min_rows and now < due:
            return PolicyPlan([], list(range(len(rows))), due)
        return super().plan(rows, now, layout, cost)


def make_policy(name: str) -> Policy:
    peers: dict[str, Callable[[], Policy]] = {
        "dynamic_batcher": DynamicBatcher,
        "token_budget": TokenBudget,
        "sorted_window": SortedWindow,
    }
    if name in PLANNERS:
        return Policy(PLANNERS[name], name)
    if name.startswith("dp_wait:"):
        return BoundedWait(float(name.partition(":")[2]) / 1e3)
    if name in peers:
        return peers[name]()
    raise BenchError(f"no policy {name!r}; known: {', '.join([*PLANNERS, *peers])}")


POLICIES = ("dp", "per_bucket", "dynamic_batcher", "token_budget", "sorted_window")

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
        self, layout: BucketLayout, table: CostTable, clock: VirtualClock, server_s_per_row: float
    ) -> None:
        self.layout, self.table, self.clock = layout, table, clock
        self.server_s_per_row = server_s_per_row
        self.forwards: list[tuple[int, int, int]] = []  # (rows, padded length, real tokens)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        rows, length = input_ids.shape
        if rows > self.layout.max_rows(length):
            raise ValueError(f"{rows} rows at {length} tokens: more than the layout's cap")
        ran = self.layout.run_batch_size(length, rows)  # a captured size, where graphs exist
        self.clock.now += self.table.seconds(ran, length) + rows * self.server_s_per_row
        self.forwards.append((rows, length, int(attention_mask.sum())))
        return np.full((rows, 1), np.nan, dtype=np.float32)

    def close(self) -> None:
        pass


@dataclass
class Result:
    policy: str
    seconds: float  # virtual time measured (after the warm-up)
    latencies_s: list[float] = field(default_factory=list)
    real_tokens: int = 0
    padded_tokens: int = 0
    forwards: int = 0
    rows_per_request: int = 1

    @property
    def rows_per_s(self) -> float:
        return len(self.latencies_s) * self.rows_per_request / self.seconds

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
) -> Result:
    """One run; exactly one of ``concurrency`` (closed loop) and ``rate`` (open loop, rows/s)
    is set. Each request holds ``rows_per_request`` rows, each of its own length; latencies are
    per request. ``server_us_per_row`` is the server's own time per row at that many rows per
    request (it is mostly per request: `server_time_per_row` measures it at the same size).
    Forwards run on the table's layout: its buckets, its caps, its captured sizes."""
    if (concurrency is None) == (rate is None):
        raise ValueError("give exactly one of concurrency and rate")
    if rows_per_request < 1:
        raise ValueError("rows_per_request must be >= 1")
    clock = VirtualClock()
    layout = table.layout
    engine = TimedEngine(layout, table, clock, server_us_per_row / 1e6)
    # the planner's cost model: the table's own fixed cost in tokens, as calibration would find it
    scheduler = Scheduler(
        engine,
        pad_token_id=0,
        cost=LinearCost(table.fixed_tokens),
        max_batch=layout.max_batch,
        max_queue_rows=10**9,
        policy=make_policy(policy),
        clock=clock,
    )
    rng = np.random.default_rng(seed)
    result = Result(policy, seconds, rows_per_request=rows_per_request)
    arrivals: list[tuple[float, int]] = []  # (time, sequence)
    sequence = 0

    def arrive_at(t: float) -> None:
        nonlocal sequence
        heapq.heappush(arrivals, (t, sequence))
        sequence += 1

    def respond_for(arrived: float) -> Callable[[object], None]:
        def respond(outcome: object) -> None:
            assert isinstance(outcome, Answer), outcome
            if clock.now >= warmup_s:
                result.latencies_s.append(clock.now - arrived)
            if concurrency is not None:
                # the answer's way out to the client and the next request's way in
                arrive_at(clock.now + round_trip_us / 1e6)

        return respond

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
    end = warmup_s + seconds
    forwards_seen = 0
    while clock.now < end:
        while arrivals and arrivals[0][0] <= clock.now:
            t, _ = heapq.heappop(arrivals)
            request_rows = [
                np.ones(int(lengths[int(rng.integers(len(lengths)))]), dtype=np.int64)
                for _ in range(rows_per_request)
            ]
            now, clock.now = clock.now, t  # the request's own arrival time
            scheduler.submit(Request(request_rows, respond_for(t)))
            clock.now = now
        wake = scheduler.wake_at
        if scheduler.queued_rows and (wake is None or clock.now >= wake):
            if not scheduler.step(clock.now) and (scheduler.wake_at or math.inf) <= clock.now:
                raise RuntimeError(f"policy {policy} waits for a time already past")
            for rows, length, real in engine.forwards[forwards_seen:]:
                if clock.now >= warmup_s:
                    result.forwards += 1
                    result.real_tokens += real
                    result.padded_tokens += rows * length
            forwards_seen = len(engine.forwards)
            continue
        upcoming = [arrivals[0][0]] if arrivals else []
        if scheduler.queued_rows and wake is not None:
            upcoming.append(wake)
        if not upcoming:
            break
        clock.now = max(clock.now, min(upcoming))
    result.seconds = max(1e-9, min(clock.now, end) - warmup_s)
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
        return p99 <= slo_ms and r.rows_per_s >= 0.95 * rate, p99

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


# -- the report (make simulate) -----------------------------------------------------------------

BEGIN, END = "<!-- simulate:begin -->", "<!-- simulate:end -->"


def forward_stats(metrics_url: str, model: str) -> dict[int, dict[str, float]]:
    """Per bucket, from the model's own metrics: forwards, rows and seconds spent in forwards."""
    from testkit.prometheus import samples_of, scrape, sum_by

    samples = scrape(metrics_url)
    out: dict[int, dict[str, float]] = {}
    names = {
        "planner_forwards_total": "forwards",
        "planner_rows_total": "rows",
        "planner_forward_seconds_sum": "seconds",
    }
    for metric, key in names.items():
        for bucket, value in sum_by(samples_of(samples, metric, model=model), "bucket").items():
            if bucket.isdigit():
                out.setdefault(int(bucket), {})[key] = value
    return out


def forwards_between(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]]
) -> dict[int, dict[str, float]]:
    """Per bucket, the forwards, rows and forward seconds between two ``forward_stats``."""
    keys = ("forwards", "rows", "seconds")
    return {
        bucket: {k: now.get(k, 0.0) - before.get(bucket, {}).get(k, 0.0) for k in keys}
        for bucket, now in after.items()
    }


def served_over_calibrated(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]], table: CostTable
) -> float:
    """Time the served forwards took over what the calibrated table gives for the same forwards
    (each bucket's forwards at its mean rows per forward)."""
    served = predicted = 0.0
    for bucket, done in forwards_between(before, after).items():
        if done["forwards"] <= 0:
            continue
        rows = done["rows"] / done["forwards"]
        served += done["seconds"]
        predicted += done["forwards"] * table.seconds(max(1, round(rows)), bucket)
    return served / predicted if predicted else float("nan")


EMULATED = "server_time"  # the emulated variant of a model, in a scratch repository


def server_time_per_row(
    version_dir: Path, tmp: Path, ms: int, concurrency: int = 64, rows_per_request: int = 1
) -> float:
    """The server's own time per row for the model at ``version_dir``, measured now: the model's
    config, queue and planner over the bench-only emulated engine with a zero table (forwards
    take no time), in a scratch repository (the model's own repository is never written), served
    by the real Triton under perf_analyzer with ``concurrency`` rows in flight, in requests of
    ``rows_per_request`` rows. Microseconds per row."""
    from bench.harness import add_emulated_variant, measure, warm_up
    from tools.triton_server import TritonServer

    model_dir = Path(version_dir).resolve().parent
    repository = tmp / "server-time-repository"
    repository.mkdir(parents=True, exist_ok=True)
    source = repository / model_dir.name
    if not source.exists():
        source.symlink_to(model_dir)
    add_emulated_variant(repository, model_dir.name, EMULATED, "zero")
    server = TritonServer.loading_only(repository, (EMULATED,), tmp / "server-time.log")
    with server:
        warm_up(server, tmp, (EMULATED,), concurrency)
        clients = max(1, concurrency // rows_per_request)
        row, _ = measure(
            EMULATED, server.grpc_url, clients, tmp, ms, rows_per_request=rows_per_request
        )
    return 1e6 / row["Inferences/Second"]


@dataclass
class ServedPoint:
    """One served measurement and what the simulator makes of it."""

    rows_per_s: float
    p50_ms: float
    server_us: float  # the server's own time per row, measured in the same round
    forwards_slowdown: float  # the served forwards' own time, over the calibrated table


def validate(lengths: Sequence[int], ms: int, rounds: int = 2) -> tuple[str, float]:
    """The real server beside the simulator, in one run, on the bench repository. Each of
    ``rounds`` rounds measures the server's own time per row (``server_time_per_row``), then
    serves planner_dp at 8, 32 and 64 clients; the simulator predicts each point from the
    calibrated CPU table and that round's time per row. Returns (table, the median time per
    row)."""
    import tempfile

    from bench.harness import build_repository, measure, warm_up
    from tools.triton_server import TritonServer

    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    version_dir = repository / "planner_dp" / "1"
    table = manifest_table(version_dir)
    levels = [8, 32, 64]
    points: dict[int, list[ServedPoint]] = {c: [] for c in levels}
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        server = TritonServer.loading_only(repository, ("planner_dp",), tmp / "t.log")
        with server:
            warm_up(server, tmp, ("planner_dp",), 64)
            metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            for _ in range(rounds):
                server_us = server_time_per_row(version_dir, tmp, ms)
                print(f"server's own time: {server_us:.0f} us per row", flush=True)
                for c in levels:
                    before = forward_stats(metrics_url, "planner_dp")
                    row, _ = measure("planner_dp", server.grpc_url, c, tmp, ms)
                    time.sleep(0.6)  # the model publishes its metrics every 0.25 s
                    slowdown = served_over_calibrated(
                        before, forward_stats(metrics_url, "planner_dp"), table
                    )
                    point = ServedPoint(
                        row["Inferences/Second"],
                        row["p50 latency"] / 1e3,
                        server_us,
                        slowdown,
                    )
                    points[c].append(point)
                    print(f"c={c}: {point}", flush=True)

    def each(values: Sequence[float], fmt: str = ".2f") -> str:
        return ", ".join(f"{v:{fmt}}" for v in values)

    def simulated(point: ServedPoint, c: int, factor: float = 1.0) -> Result:
        return simulate(
            lengths,
            scaled_table(table, factor) if factor != 1.0 else table,
            "dp",
            concurrency=c,
            seconds=60,
            server_us_per_row=point.server_us,
        )

    per_round_us = [p.server_us for p in points[levels[0]]]
    lines = [
        f"{rounds} rounds, in one run; each column lists the rounds in order. The server's own "
        f"time per row, measured at the start of each round: {each(per_round_us, '.0f')} us.",
        "",
        "| concurrency | served rows/s | simulated rows/s | simulated / served | served p50 ms | simulated p50 ms | served forwards / calibrated | simulated with served forward times / served |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for c in levels:
        mine = points[c]
        plain = [simulated(p, c) for p in mine]
        in_place = [simulated(p, c, p.forwards_slowdown).rows_per_s / p.rows_per_s for p in mine]
        lines.append(
            f"| {c} | {each([p.rows_per_s for p in mine], '.1f')} | "
            f"{each([r.rows_per_s for r in plain], '.1f')} | "
            f"{each([r.rows_per_s / p.rows_per_s for r, p in zip(plain, mine, strict=True)])} | "
            f"{each([p.p50_ms for p in mine], '.0f')} | "
            f"{each([r.percentile_ms(50) for r in plain], '.0f')} | "
            f"{each([p.forwards_slowdown for p in mine])} | {each(in_place)} |"
        )
    return "\n".join(lines), float(np.median(per_round_us))


FIXED_COSTS_TOKENS = (15, 50, 150, 300, 600, 1200)
GAIN_PLOT = ROOT / "docs" / "simulate_gain.png"


def gain_points(lengths: Sequence[int], us_per_row: float) -> list[dict[str, float]]:
    """Rows/s of each policy at 64 clients as the fixed cost of a forward grows, per-token cost
    held at the A30 rule's; with the server's own time per row left out (the engine alone) and
    included (as measured here)."""
    a30 = gpu_table("a30")
    # the A30 rule's cost of one more token at T=64 (its B=64 forward less its B=1 forward)
    per_token_s = (a30.seconds(64, 64) - a30.seconds(1, 64)) / (63 * 64)
    points = []
    for tokens in FIXED_COSTS_TOKENS:
        fixed_s = tokens * per_token_s
        table = linear_table(fixed_s, per_token_s, f"fixed {tokens} tokens")
        for server in (0.0, us_per_row):
            point = {"tokens": float(tokens), "fixed_ms": fixed_s * 1e3, "server_us": server}
            for p in POLICIES:
                point[p] = simulate(
                    lengths, table, p, concurrency=64, seconds=10, server_us_per_row=server
                ).rows_per_s
            points.append(point)
    return points


def plot_gain(points: list[dict[str, float]], path: Path = GAIN_PLOT) -> Path:
    """Two panels, the engine alone and with the server's time per row: each policy's rows/s
    against the fixed cost of a forward."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({p["server_us"] for p in points})
    fig, axes = plt.subplots(1, len(servers), figsize=(6 * len(servers), 4.2), squeeze=False)
    for ax, server in zip(axes[0], servers, strict=True):
        mine = [p for p in points if p["server_us"] == server]
        for policy in POLICIES:
            ax.plot(
                [p["tokens"] for p in mine], [p[policy] for p in mine], marker="o", label=policy
            )
        ax.set_xscale("log")
        ax.set_xlabel("fixed cost of a forward (padded tokens)")
        ax.set_ylabel("simulated rows/s at 64 clients")
        title = "engine alone" if server == 0 else f"with the server's {server:.0f} us per row"
        ax.set_title(f"A30 per-token cost, {title}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def gain_by_fixed_cost(lengths: Sequence[int], us_per_row: float) -> str:
    """The gain table (``gain_points``), and its plot written to docs/."""
    points = gain_points(lengths, us_per_row)
    plot_gain(points)
    lines = [
        "| fixed cost (tokens) | fixed cost (ms) | server us/row | "
        + " | ".join(POLICIES)
        + " | DP / per-bucket | DP / best peer |",
        "|---" * (len(POLICIES) + 5) + "|",
    ]
    for rates in points:
        peers = max(rates[p] for p in POLICIES[2:])
        lines.append(
            f"| {rates['tokens']:.0f} | {rates['fixed_ms']:.3f} | {rates['server_us']:.0f} | "
            + " | ".join(f"{rates[p]:.0f}" for p in POLICIES)
            + f" | {rates['dp'] / rates['per_bucket']:.2f}x | {rates['dp'] / peers:.2f}x |"
        )
    return "\n".join(lines)


def throughput_under_slo(lengths: Sequence[int], us_per_row: float, slo_ms: float) -> str:
    lines = [
        "| GPU table | server us/row | " + " | ".join(POLICIES) + " |",
        "|---" * (len(POLICIES) + 2) + "|",
    ]
    for gpu in sorted(PUBLISHED_BERT_BASE_FP16_MS):
        table = gpu_table(gpu)
        for server in (0.0, us_per_row):
            best = [best_under_slo(lengths, table, p, slo_ms, server)[0] for p in POLICIES]
            lines.append(f"| {gpu} | {server:.0f} | " + " | ".join(f"{b:.0f}" for b in best) + " |")
    return "\n".join(lines)


def bounded_wait(lengths: Sequence[int], us_per_row: float) -> str:
    """Does waiting for a fuller collection pay when the queue is short? Open loop on the A30
    table, at a light and a heavy rate, for waits of 0 to 5 ms."""
    table = gpu_table("a30")
    lines = [
        "| rate (rows/s) | wait (ms) | served rows/s | p50 ms | p99 ms | forwards/s |",
        "|---|---|---|---|---|---|",
    ]
    for rate in (200.0, 1000.0):
        for wait_ms in (0, 1, 2, 5):
            policy = "dp" if wait_ms == 0 else f"dp_wait:{wait_ms}"
            s = simulate(
                lengths, table, policy, rate=rate, seconds=20, server_us_per_row=us_per_row
            ).summary()
            lines.append(
                f"| {rate:.0f} | {wait_ms} | {s['rows_per_s']:.0f} | {s['p50_ms']:.2f} | "
                f"{s['p99_ms']:.2f} | {s['forwards_per_s']:.0f} |"
            )
    return "\n".join(lines)


def report(lengths: Sequence[int], ms: int, slo_ms: float, rounds: int = 2) -> str:
    validation, us_per_row = validate(lengths, ms, rounds)
    sources = "\n".join(f"- {gpu_table(g).source}" for g in sorted(PUBLISHED_BERT_BASE_FP16_MS))
    return "\n".join(
        [
            "## Simulation: the planner where a forward's fixed cost is large",
            "",
            "    make simulate   # = .venv/bin/python -m bench.simulate --report",
            "",
            "`bench/simulate.py` drives the project's own scheduler step by step on a virtual clock;",
            "an engine that computes nothing moves the clock by a cost table's time for each forward,",
            "plus the server's own time per row. Requests: one row each, lengths replayed from",
            "`bench/data/request_lengths.txt` (the benchmark's real-text requests). The peers'",
            "batchers run as policies in this project's loop: an approximation of those servers.",
            "",
            "### Validation on this CPU",
            "",
            validation,
            "",
            "Each point is predicted from what a user of the simulator has: the model's calibrated",
            "table (timed when it was built: batch sizes 1, 2, 4, 8, 16 and the max rows of each",
            "bucket, each point for at least 0.2 s) and the server's own time per row, measured",
            "at the start of the round by `server_time_per_row` (the model's config, queue and",
            "planner over the emulated engine with a zero table, served by the real Triton in a",
            "scratch repository). `python -m bench.simulate --cost manifest:DIR` measures it the",
            "same way before it simulates.",
            "",
            "The last two columns find out where a miss comes from. *Served forwards / calibrated*:",
            "the time the engine's forwards really took in the served run (the model's own",
            "`planner_forward_seconds` per bucket), over what the calibrated table gives for the",
            "same forwards. *Simulated with served forward times*: the same server model (queue,",
            "planner, the server's time per row) with the table scaled by that ratio. Where the",
            "plain simulation misses and this one lands close, the miss is the engine's own speed",
            "beside Triton, the stub and the client on this shared 2-core machine, not the model",
            "of the server.",
            "",
            "### GPU tables (derived from published measurements, not measured here)",
            "",
            "The rule t(B, T) = fixed + B*T*per_token + B*T^2*attention is fitted to NVIDIA's",
            "published TensorRT BERT-base FP16 latencies (NVIDIA/TensorRT, demo/BERT/README.md,",
            "average ms at sequence lengths 128 and 384, batch 1 to 128; the times leave out",
            "host-device copies, so the fixed cost they imply is a lower bound), then scaled to",
            "MiniLM-L6: fixed cost by layers (6/12), per-token cost by layers x hidden^2 (1/8),",
            "attention by layers x hidden (1/4). The fixed cost is never scaled by length.",
            "",
            sources,
            "",
            "### The DP's gain as the fixed cost of a forward grows",
            "",
            "Rows/s at 64 clients, per-token cost of the A30 rule; server us/row 0 is the engine",
            f"alone, {us_per_row:.0f} the server's own time per row as measured above:",
            "",
            gain_by_fixed_cost(lengths, us_per_row),
            "",
            "![simulated rows/s against the fixed cost of a forward](simulate_gain.png)",
            "",
            f"### Throughput under a p99 SLO of {slo_ms:.0f} ms (open loop, Poisson)",
            "",
            "Highest rate each policy sustains with p99 under the SLO, with the server's own time",
            "per row left out (0: the engine alone) and included (as measured on this CPU):",
            "",
            throughput_under_slo(lengths, us_per_row, slo_ms),
            "",
            "### A bounded wait for a fuller collection",
            "",
            "The DP planner, waiting while fewer than 32 rows are queued, at most the given time",
            f"past the oldest row's arrival (A30 table, the server's {us_per_row:.0f} us per row):",
            "",
            bounded_wait(lengths, us_per_row),
        ]
    )


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=Path, default=LENGTHS)
    parser.add_argument("--cost", default="table:a30", help="manifest:DIR or table:a100|a30")
    parser.add_argument(
        "--policy", default="dp", help=f"{', '.join(POLICIES)}, or dp_wait:MS (a bounded wait)"
    )
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=None)
    load.add_argument("--rate", type=float, default=None, help="rows/s, Poisson arrivals")
    parser.add_argument("--bursty", action="store_true", help="with --rate: arrivals in bursts")
    parser.add_argument("--seconds", type=float, default=60.0, help="virtual seconds measured")
    parser.add_argument(
        "--server-us-per-row",
        type=float,
        default=None,
        help="the server's own time per row; default: measured now for a manifest: table (the "
        "model over an emulated engine, served by the real Triton), 0 (the engine alone) for a "
        "GPU table",
    )
    parser.add_argument(
        "--round-trip-us",
        type=float,
        default=0.0,
        help="closed loop: time from an answer leaving the engine to the client's next "
        "request reaching the queue",
    )
    parser.add_argument(
        "--rows-per-request",
        type=int,
        default=1,
        help="rows in each request (--concurrency counts requests, --rate rows/s)",
    )
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.add_argument(
        "--report",
        action="store_true",
        help="validate against the real server, then the GPU answers; writes docs/PERFORMANCE.md",
    )
    parser.add_argument("--slo-ms", type=float, default=50.0)
    parser.add_argument(
        "--validate-only",
        action="store_true",
        help="only the validation against the real server, printed (docs/ left alone)",
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="only the plot of rows/s against the fixed cost of a forward (docs/simulate_gain.png), "
        "with --server-us-per-row as the server's own time",
    )
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=2, help="validation: served rounds")
    args = parser.parse_args(argv)
    lengths = read_lengths(args.lengths)
    if args.validate_only:
        print(validate(lengths, args.measurement_ms, args.rounds)[0])
        return 0
    if args.plot:
        print(plot_gain(gain_points(lengths, args.server_us_per_row or 0.0)))
        return 0
    if args.report:
        text = report(lengths, args.measurement_ms, args.slo_ms, args.rounds)
        print(text)
        write_section(text, BEGIN, END)
        return 0
    table = cost_table(args.cost)
    server_us = args.server_us_per_row
    if server_us is None and table.version_dir is not None:  # a built model's measured table
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            server_us = server_time_per_row(
                table.version_dir,
                Path(tmp),
                args.measurement_ms,
                rows_per_request=args.rows_per_request,
            )
        print(f"the server's own time, measured now: {server_us:.0f} us per row")
    elif server_us is None:
        server_us = 0.0
        print("the server's own time per row left out (--server-us-per-row): the engine alone")
    concurrency = args.concurrency if args.rate is None else None
    if concurrency is None and args.rate is None:
        concurrency = 64
    r = simulate(
        lengths,
        table,
        args.policy,
        concurrency=concurrency,
        rate=args.rate,
        bursty=args.bursty,
        seconds=args.seconds,
        server_us_per_row=server_us,
        round_trip_us=args.round_trip_us,
        rows_per_request=args.rows_per_request,
    )
    s = r.summary()
    if args.json:
        print(json.dumps({"policy": args.policy, "cost": table.name, **s}))
    print(table.source)
    load_text = f"concurrency {concurrency}" if concurrency else f"rate {args.rate}/s"
    print(
        f"{args.policy} on {table.name}, {load_text}: p50 {s['p50_ms']:.1f} ms, p99 "
        f"{s['p99_ms']:.1f} ms, padding efficiency {s['padding_efficiency']:.3f}, "
        f"{s['forwards_per_s']:.1f} forwards/s, {s['tokens_per_s']:.0f} real tokens/s, "
        f"simulated rows/s {s['rows_per_s']:.1f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
