"""The server's CPU as a resource of C cores, beside the GPU's cost table.

What a request costs on the CPU is measured here per process from /proc (``bench.cpu_model``),
at each size of request (rows per request), for each layout:
- Triton: its HTTP/gRPC core, many threads, so it may use every core, up to its own ceiling in
  requests/s (``TRITON_CEILING_PER_S``, reported upstream);
- a front (the split layout): decoding, tokenizing, answering Triton;
- the queue owner: its serial work per request, the transport included (its cost per request
  grows with the fronts: each front's messages carry fewer requests);
- today's one-process model: front and owner in one process per instance;
- the client, where it shares the cores (this machine's validation; none on a served node).

A front or a one-process model also has a serial time per request (``serial_us``), longer than
its CPU: the Python backend hands each request from Triton to the stub and back, and the stub's
threads take turns under the GIL. One such process serves at most ``1 / serial`` requests/s;
it is measured where one front (or one process) is the bound.

A closed loop of many clients is served at the lowest of these ceilings (requests/s):
``C / (sum of the processes' CPU)`` (the cores, shared), ``K / front serial`` (or ``N / model
serial``), ``1 / owner``, and Triton's own. Behind them the GPU: the owner's planner, stepped by
the simulator (``bench.sim.run.simulate``) over the cost table, with the owner's CPU per row in
series with each forward, serving a closed loop of the clients. The served rate is the lower of
the CPU's ceiling and the engine's. Queueing between the processes is not modelled beyond that:
the ceilings hold where one of them is clearly the bottleneck, and overestimate near a tie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from bench.cost_tables import CostTable, scaled_table
from bench.sim.run import Result, simulate

# Triton's core, at the top of its scaling on many cores: about 50-60k inferences/s
# (triton-inference-server/server#7590, a user's report with perf_analyzer, not NVIDIA's
# figure); the middle of that range
TRITON_CEILING_PER_S = 55_000.0


@dataclass(frozen=True)
class CpuCosts:
    """One layout's CPU microseconds per request by role (triton, front, owner, model, client),
    and the serial microseconds per request of one front or one model process."""

    us: dict[str, float]
    serial_us: float
    # CPU per request in series with the forwards: the scheduler's (the owner's cost; for
    # today's model, where it is not measured apart, the owner's of the split layout)
    in_series_us: float = 0.0
    triton_ceiling_per_s: float = TRITON_CEILING_PER_S

    def of(self, role: str) -> float:
        return self.us.get(role, 0.0)

    def without_client(self) -> CpuCosts:
        return replace(self, us={k: v for k, v in self.us.items() if k != "client"})


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
            return "peer: Triton's C++ backend"
        if self.fronts:
            return f"{self.fronts} front{'s' if self.fronts > 1 else ''}"
        return f"{self.instances} instance{'s' if self.instances > 1 else ''}"


def cpu_ceilings(costs: CpuCosts, cores: float, layout: Layout) -> dict[str, float]:
    """Requests/s each CPU limit allows, by name."""
    limits = {"Triton's ceiling": costs.triton_ceiling_per_s}
    spent = sum(costs.us.values())
    if spent > 0:
        limits["cores"] = cores / (spent * 1e-6)
    if not layout.peer and costs.serial_us > 0:
        if layout.fronts:
            limits["fronts"] = layout.fronts / (costs.serial_us * 1e-6)
        else:
            limits["instances"] = layout.instances / (costs.serial_us * 1e-6)
    if layout.fronts and costs.of("owner") > 0:
        limits["owner"] = 1 / (costs.of("owner") * 1e-6)
    return limits


@dataclass(frozen=True)
class Served:
    """A predicted ceiling: rows/s, and what bounds it."""

    rows_per_s: float
    bound: str
    cpu_rows_per_s: float  # the CPU's own ceiling, in rows/s
    rows_per_forward: float = math.nan
    limits: dict[str, float] = field(default_factory=dict)


def rows_per_forward(result: Result) -> float:
    """Rows a forward carried, over the measured (post warm-up) part of a run."""
    return result.rows_per_s * result.seconds / max(1, result.forwards)


def predict(
    lengths: Sequence[int],
    table: CostTable | None,
    costs: CpuCosts,
    cores: float,
    rows: int,
    layout: Layout,
    policy: str = "dp",
    clients: int | None = None,
    seconds: float = 2.0,
) -> Served:
    """What ``clients`` closed-loop clients (default: 4,096 rows in flight), each with one request
    of ``rows`` rows in flight, get, ``costs`` measured at that size: the lower of the CPU's
    ceiling and what the engine behind it (``table``; None: forwards take no time) serves to
    that many clients, the scheduler's CPU in series with each forward. With the engine the
    bound, the clients' requests wait in the owner's queue, so the engine's closed loop holds
    them all (the time each spends in the fronts is left out: an upper estimate near a tie)."""
    limits = cpu_ceilings(costs, cores, layout)
    bound = min(limits, key=lambda k: limits[k])
    cpu_rows = limits[bound] * rows
    if table is None:
        return Served(cpu_rows, bound, cpu_rows, limits=limits)
    # in series with the forwards: the scheduler's CPU; none for the peer (Triton's core)
    serial_us_per_row = 0.0 if layout.peer else costs.in_series_us / rows
    planners = layout.instances if not layout.fronts and not layout.peer else 1
    # today's N instances: N planners, each with 1/N of the clients, each context time-sliced
    # to 1/N of the GPU while all are busy (no overlap between contexts assumed)
    shared = scaled_table(table, planners) if planners > 1 else table
    in_flight = clients if clients is not None else max(1, 4096 // rows)

    def run(concurrency: int | None = None, rate: float | None = None) -> Result:
        return simulate(
            lengths,
            shared,
            policy,
            concurrency=concurrency,
            rate=rate,
            seconds=seconds,
            warmup_s=0.2,
            server_us_per_row=serial_us_per_row,
            rows_per_request=rows,
        )

    engine = run(concurrency=max(1, in_flight // planners))
    engine_rows = engine.rows_per_s * planners
    if cpu_rows <= engine_rows:
        # the CPU binds: the engine sees the CPU's rate, and fills its forwards at that rate
        at_cpu = run(rate=cpu_rows / planners)
        return Served(cpu_rows, bound, cpu_rows, rows_per_forward(at_cpu), limits)
    # the forwards, with the owner's CPU in series: which of the two takes more of the time
    serial_share = engine.rows_per_s * serial_us_per_row * 1e-6
    where = "GPU" if serial_share < 0.5 else "owner + GPU in series"
    return Served(engine_rows, where, cpu_rows, rows_per_forward(engine), limits)
