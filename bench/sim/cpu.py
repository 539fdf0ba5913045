"""The server's CPU as a resource of C cores, beside the GPU's cost table.

Every process on the request path spends CPU per request, ``a + b x rows`` microseconds
(``ProcessCost``), measured here per process from /proc (``bench.cpu_model``):
- Triton: its HTTP/gRPC core, many threads, so it may use every core, up to its own ceiling in
  requests/s (``TRITON_CEILING_PER_S``, reported upstream);
- a front (the split layout): decoding, tokenizing, answering Triton; a Python process holds one
  core at most, and ``K`` fronts share the requests evenly;
- the queue owner: its serial work per request and row, the transport included; one core;
- today's one-process model (``N`` instances): front and owner in one process per instance;
- the client, where it shares the cores (this machine's validation; none on a served node).

A closed loop of many clients is served at the lowest of these ceilings (requests/s):
``C / (sum of every process's cost)`` (the cores, shared), ``K / front`` (or ``N / model``),
``1 / owner``, and Triton's own. Behind them the GPU: the owner's planner, stepped by the
simulator (``bench.sim.run.simulate``) over the cost table, with the owner's serial CPU per row
added to each forward. The served rate is the CPU's ceiling when the simulated engine keeps up
with it, else what the engine serves. No queueing between the processes is modelled beyond
that: the ceilings hold where one of them is clearly the bottleneck, and overestimate near a tie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.cost_tables import CostTable, scaled_table
from bench.sim.run import Result, simulate

# Triton's core, at the top of its scaling on many cores: about 50-60k inferences/s
# (triton-inference-server/server#7590, a user's report with perf_analyzer, not NVIDIA's
# figure); the middle of that range
TRITON_CEILING_PER_S = 55_000.0


@dataclass(frozen=True)
class ProcessCost:
    """CPU microseconds a process spends per request of ``rows`` rows: ``per_request + per_row
    x rows``."""

    per_request_us: float
    per_row_us: float = 0.0

    def us(self, rows: int) -> float:
        return self.per_request_us + self.per_row_us * rows

    @staticmethod
    def fitted(points: dict[int, float]) -> ProcessCost:
        """The line through (rows, us per request) points: least squares, never negative."""
        if len(points) == 1:
            ((_, us),) = points.items()
            return ProcessCost(us)
        xs, ys = list(points), list(points.values())
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
            (x - mx) ** 2 for x in xs
        )
        slope = max(0.0, slope)
        return ProcessCost(max(0.0, my - slope * mx), slope)


@dataclass(frozen=True)
class CpuCosts:
    """Each role's CPU per request: triton, front, owner (the split layout), model (today's
    one-process model), client (only where the load generator shares the cores)."""

    roles: dict[str, ProcessCost]
    triton_ceiling_per_s: float = TRITON_CEILING_PER_S

    def us(self, role: str, rows: int) -> float:
        cost = self.roles.get(role)
        return cost.us(rows) if cost is not None else 0.0

    def without_client(self) -> CpuCosts:
        return CpuCosts(
            {k: v for k, v in self.roles.items() if k != "client"}, self.triton_ceiling_per_s
        )


@dataclass(frozen=True)
class Layout:
    """The split layout with ``fronts`` fronts and one owner, or today's model with
    ``instances`` independent instances (fronts 0); or the peer: Triton's own C++ backend
    (``peer``), whose only CPU on the path is Triton's."""

    fronts: int = 0
    instances: int = 1
    peer: bool = False

    def label(self) -> str:
        if self.peer:
            return "Triton C++ backend (peer)"
        if self.fronts:
            return f"{self.fronts} front{'s' if self.fronts > 1 else ''}"
        return f"{self.instances} instance{'s' if self.instances > 1 else ''}"


def cpu_ceilings(costs: CpuCosts, cores: float, rows: int, layout: Layout) -> dict[str, float]:
    """Requests/s each CPU limit allows, by name."""
    triton = costs.us("triton", rows)
    client = costs.us("client", rows)
    limits = {"triton ceiling": costs.triton_ceiling_per_s}
    if layout.peer:
        limits["cores"] = cores / ((triton + client) * 1e-6)
        return limits
    if layout.fronts:
        front, owner = costs.us("front", rows), costs.us("owner", rows)
        limits["cores"] = cores / ((triton + front + owner + client) * 1e-6)
        limits["fronts"] = layout.fronts / (front * 1e-6)
        limits["owner"] = 1 / (owner * 1e-6)
    else:
        model = costs.us("model", rows)
        limits["cores"] = cores / ((triton + model + client) * 1e-6)
        limits["instances"] = layout.instances / (model * 1e-6)
    return {k: v for k, v in limits.items() if math.isfinite(v)}


@dataclass(frozen=True)
class Served:
    """A predicted ceiling: rows/s, and what bounds it."""

    rows_per_s: float
    bound: str
    cpu_rows_per_s: float  # the CPU's own ceiling, in rows/s
    rows_per_forward: float = math.nan
    limits: dict[str, float] = field(default_factory=dict)


def engine_serial_us_per_row(costs: CpuCosts, rows: int, layout: Layout) -> float:
    """The CPU time per row that runs in series with the forwards: the owner's (or, in today's
    model, the scheduler's share of the one process, taken as its owner's cost); none for the
    peer, whose batcher is Triton's C++ core."""
    if layout.peer:
        return 0.0
    return costs.us("owner", rows) / rows


def predict(
    lengths: Sequence[int],
    table: CostTable | None,
    costs: CpuCosts,
    cores: float,
    rows: int,
    layout: Layout,
    clients: int,
    policy: str = "dp",
    seconds: float = 20.0,
) -> Served:
    """The ceiling of ``clients`` closed-loop clients in requests of ``rows`` rows: the CPU's,
    unless the engine behind it (``table``; None: forwards take no time) cannot keep up."""
    limits = cpu_ceilings(costs, cores, rows, layout)
    bound = min(limits, key=lambda k: limits[k])
    cpu_rows = limits[bound] * rows
    if table is None:
        return Served(cpu_rows, bound, cpu_rows, limits=limits)
    serial_us = engine_serial_us_per_row(costs, rows, layout)
    planners = layout.instances if not layout.fronts and not layout.peer else 1
    # today's N instances: N planners, each with 1/N of the rows, each context time-sliced to
    # 1/N of the GPU while all are busy (no overlap between contexts assumed)
    shared = scaled_table(table, planners) if planners > 1 else table
    offered = cpu_rows / planners
    kept = simulate(
        lengths,
        shared,
        policy,
        rate=offered,
        seconds=max(2.0, min(seconds, 4000 / max(offered, 1.0))),
        warmup_s=min(2.0, 200 / max(offered, 1.0)),
        server_us_per_row=serial_us,
        rows_per_request=rows,
    )
    if kept.rows_per_s >= 0.97 * offered:
        return Served(cpu_rows, bound, cpu_rows, rows_per_forward(kept), limits)
    closed = simulate(
        lengths,
        shared,
        policy,
        concurrency=max(1, clients // planners),
        seconds=max(2.0, min(seconds, 4000 / max(offered, 1.0))),
        warmup_s=1.0,
        server_us_per_row=serial_us,
        rows_per_request=rows,
    )
    engine_rows = closed.rows_per_s * planners
    if engine_rows >= cpu_rows:  # the open loop's queue grew, the closed loop keeps up
        return Served(cpu_rows, bound, cpu_rows, rows_per_forward(closed), limits)
    return Served(engine_rows, "engine", cpu_rows, rows_per_forward(closed), limits)


def rows_per_forward(result: Result) -> float:
    """Rows a forward carried, over the measured (post warm-up) part of a run."""
    return result.rows_per_s * result.seconds / max(1, result.forwards)
