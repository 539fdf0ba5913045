"""The simulator's CPU model (bench.sim.cpu), measured, validated and used on this machine.

    python -m bench.cpu_model measure [--rounds 3] [--measurement-ms 5000] [--pin-cores both]
    python -m bench.cpu_model measure-owner [--rounds 3]
    python -m bench.cpu_model measure-floor [--rounds 3] [--pin-cores on]
    python -m bench.cpu_model measure-ids [--rounds 3] [--pin-cores both]
    python -m bench.cpu_model report

``measure`` serves the bench model over the emulated engine with a zero table (forwards take
no time: the server around the engine, its ceiling at GPU speed) on the real Triton, at 1, 8
and 64 rows per request (64, 32 and 8 clients: 64, 256 and 512 rows in flight), as today's one
process and as the split layout with 1 and 2 fronts, variants alternating in an order that flips
every round; for each point it records the served rows/s and every server process's CPU per
request from /proc (``bench.fronts.serve_once``), and the rest of the machine's busy CPU (the
client). With ``--pin-cores on`` its processes are pinned to cores of their own (``pin_cores``);
``both`` alternates every variant pinned and unpinned. It writes them to
bench/data/cpu_costs.json.

``measure-owner`` adds the owner's CPU per request with a core of its own (``bench.owner_alone``),
all of it and its scheduler thread's; and, alternating with those runs, the owner over an engine
whose forwards wait a GPU table's time: what it serves, to check which of the two runs in series
with the forwards.
``measure-floor`` adds the Python backend's floor (``bench.fronts --floor``) at 1 and 64 rows per
request: the least any design that answers each request from a Python-backend stub spends;
with ``--pin-cores on``, the floor with its process on a core of its own (``pin_cores``), kept
beside the unpinned one.
``measure-ids`` measures one-row requests whose clients send token ids (INPUT_IDS: a client
that tokenizes; no tokenizing in the server) as ``measure`` does, the layouts and the floor
alternating: the like-for-like comparison with the peer, whose clients send token ids too.

``report`` predicts every measured point from that layout's own CPU per request at that size
and the serial time of one front (one process) measured where it served alone, with this
machine's cores, and prints predicted beside served (each round's served figure too); then it
predicts a 16-core node with one GPU (derived A100 and A30 tables, the owner at its cost alone,
no client on its cores), unpinned and, where measured, pinned, and writes both to
docs/PERFORMANCE.md, with docs/cpu_model.png.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bench.cost_tables import CostTable, cost_table, gpu_table, read_lengths, slowed_table
from bench.docs import save_figure, write_section
from bench.errors import BenchError, reports_errors
from bench.paths import LENGTHS, ROOT
from bench.sim.cpu import TRITON_CEILING_PER_S, CpuCosts, Layout, Served, cpu_ceilings, predict
from builder.cores import default_fronts

if TYPE_CHECKING:  # bench.fronts starts servers: imported where a measurement runs
    from bench.fronts import Served as FrontsServed

COSTS_FILE = ROOT / "bench" / "data" / "cpu_costs.json"
PLOT = ROOT / "docs" / "cpu_model.png"
BEGIN, END = "<!-- cpu-model:begin -->", "<!-- cpu-model:end -->"
ROWS = (1, 8, 64)
CLIENTS = {1: 64, 8: 32, 64: 8}  # 64, 256 and 512 rows in flight
NODE_ROWS = (1, 64)  # rows per request: one-row clients, and 64-row requests
# closed-loop clients on a node, by rows per request: the 256 one-row clients, and 16
# clients of 64-row requests (1,024 rows in flight)
NODE_CLIENTS = {1: 256, 64: 16}
LAYOUTS = (0, 1, 2)  # today's one process, then 1 and 2 fronts (bench.fronts.variant)
# --pin-cores: the variants measured unpinned, pinned (pin_cores), or both side by side
PINS = {"off": (False,), "on": (True,), "both": (False, True)}


def served_point(
    round_number: int, fronts: int | str, pinned: bool, rows: int, served: FrontsServed
) -> dict[str, object]:
    """One measured point as bench/data/cpu_costs.json keeps it."""
    return {
        "round": round_number,
        "fronts": fronts,
        "pinned": pinned,
        "rows": rows,
        "clients": CLIENTS[rows],
        "rows_per_s": served.rows_per_s,
        "cpu_us_per_request": served.cpu_us_per_request,
        "client_us_per_request": served.other_us_per_request,
        "stable": served.stable,
    }


def measure(
    rounds: int, ms: int, repository: Path, pins: tuple[bool, ...] = (False,)
) -> dict[str, object]:
    from bench.fronts import serve_once
    from bench.harness import build_repository

    repository, _ = build_repository(repository, rebuild=False)
    points: list[dict[str, object]] = []
    order = [(fronts, rows, pinned) for rows in ROWS for fronts in LAYOUTS for pinned in pins]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for fronts, rows, pinned in order if r % 2 == 0 else order[::-1]:
                served = serve_once(
                    repository, fronts, CLIENTS[rows], rows, Path(tmp), ms, "zero", pinned=pinned
                )
                point = served_point(r + 1, fronts, pinned, rows, served)
                points.append(point)
                print(json.dumps(point), flush=True)
    return {"cores": os.cpu_count(), "measurement_ms": ms, "points": points}


OWNER_ROWS = (1, 64)
# the waiting engine the owner is served over to check what of its CPU runs in series with the
# forwards (bench.owner_alone --table)
OWNER_TABLE = "table:a30"


def sleep_overshoot_us(wait_s: float = 1.5e-3, times: int = 300) -> float:
    """How much longer than asked a wait of about a forward's length takes here: the waiting
    engine's forwards take that much more than its table says."""
    started = time.perf_counter()
    for _ in range(times):
        time.sleep(wait_s)
    return ((time.perf_counter() - started) / times - wait_s) * 1e6


def measure_owner_alone(rounds: int, seconds: float) -> dict[str, object]:
    """The owner alone on a core of its own (``bench.owner_alone``: pinned, fed by 2 processes as
    2 fronts), by rows per request, alternating every round:
    - over a zero-time engine, as many requests in flight as the served runs: its CPU per
      request, all of it and its scheduler thread's (``owner_alone_us``,
      ``owner_alone_scheduler_us``): what a node's owner costs where it does not share its core;
    - over an engine whose forwards wait ``OWNER_TABLE``'s time (a GPU's, derived), the node's
      clients in flight: what it serves, and the same two costs (``owner_over_table``), to
      check which of them runs in series with the forwards; and what it serves with its
      forwards on an engine thread (``overlap_forwards``)."""
    from bench.owner_alone import one_round

    zero: dict[str, dict[str, list[float]]] = {}
    timed: dict[str, dict[str, list[float]]] = {}
    for rows in OWNER_ROWS:
        mine_zero = zero.setdefault(str(rows), {"owner_us": [], "scheduler_us": []})
        mine_timed = timed.setdefault(
            str(rows), {"rows_per_s": [], "owner_us": [], "scheduler_us": []}
        )
        # zero-time engine; the waiting table; the waiting table with the overlap
        kinds = (("zero", False), (OWNER_TABLE, False), (OWNER_TABLE, True))
        for r in range(rounds):
            for table, overlap in kinds if r % 2 == 0 else kinds[::-1]:
                clients = CLIENTS[rows] if table == "zero" else NODE_CLIENTS[rows]
                got = one_round(rows, clients, seconds, feeders=2, table=table, overlap=overlap)
                if overlap:
                    mine_timed.setdefault("overlap_rows_per_s", []).append(got.rows_per_s)
                    print(
                        f"owner alone, {rows} rows a request, {table}, {clients} clients, "
                        f"overlap: {got.rows_per_s:.0f} rows/s",
                        flush=True,
                    )
                    continue
                mine = mine_zero if table == "zero" else mine_timed
                mine["owner_us"].append(got.us_per_request(got.owner_share, rows))
                mine["scheduler_us"].append(got.us_per_request(got.scheduler_share, rows))
                if table != "zero":
                    mine["rows_per_s"].append(got.rows_per_s)
                print(
                    f"owner alone, {rows} rows a request, {table}, {clients} clients: "
                    f"{got.rows_per_s:.0f} rows/s, {mine['owner_us'][-1]:.0f} us a request "
                    f"(its scheduler thread {mine['scheduler_us'][-1]:.0f})",
                    flush=True,
                )
    return {
        "owner_alone_us": {k: float(np.mean(v["owner_us"])) for k, v in zero.items()},
        "owner_alone_scheduler_us": {k: float(np.mean(v["scheduler_us"])) for k, v in zero.items()},
        "owner_over_table": {
            "table": OWNER_TABLE,
            "sleep_overshoot_us": sleep_overshoot_us(),
            "clients": {str(rows): NODE_CLIENTS[rows] for rows in OWNER_ROWS},
            "runs": timed,
        },
    }


def measure_floor(
    rounds: int, ms: int, repository: Path, pinned: bool = False
) -> dict[str, dict[str, float]]:
    """The Python backend's floor (``bench.fronts --floor``: a bench-only model that tokenizes
    each request and answers zeros from a thread, no queue, owner or planner) at each node size
    of request: its CPU per request by process, means of ``rounds`` runs, the client excluded.
    Any design that answers each request from a Python-backend stub pays at least this.
    ``pinned``: its process on a core of its own, as pinned fronts are."""
    from bench.fronts import FLOOR, serve_once
    from bench.harness import build_repository

    repository, _ = build_repository(repository, rebuild=False)
    runs: dict[int, list[dict[str, float]]] = {rows: [] for rows in NODE_ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for rows in NODE_ROWS if r % 2 == 0 else NODE_ROWS[::-1]:
                served = serve_once(
                    repository, FLOOR, CLIENTS[rows], rows, Path(tmp), ms, "zero", pinned=pinned
                )
                runs[rows].append(served.cpu_us_per_request)
                print(f"floor, {rows} rows a request: {served.cpu_us_per_request}", flush=True)
    return {
        str(rows): {role: float(np.mean([run[role] for run in mine])) for role in sorted(mine[0])}
        for rows, mine in runs.items()
    }


def measure_token_ids(
    rounds: int, ms: int, repository: Path, pins: tuple[bool, ...] = (False,)
) -> list[dict[str, object]]:
    """One-row requests whose clients send token ids (``bench.fronts --inputs ids``): today's
    one process, 1 and 2 fronts, and the Python backend's floor (its ``fronts`` "floor"), each
    pinned or not as ``pins`` asks, in an order that flips every round; points as ``measure``
    writes them."""
    from bench.fronts import FLOOR, serve_once
    from bench.harness import build_repository

    repository, _ = build_repository(repository, rebuild=False)
    points: list[dict[str, object]] = []
    order = [(fronts, pinned) for fronts in (*LAYOUTS, FLOOR) for pinned in pins]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for fronts, pinned in order if r % 2 == 0 else order[::-1]:
                served = serve_once(
                    repository,
                    fronts,
                    CLIENTS[1],
                    1,
                    Path(tmp),
                    ms,
                    "zero",
                    pinned=pinned,
                    token_ids=True,
                )
                point = served_point(r + 1, fronts, pinned, 1, served)
                points.append(point)
                print(json.dumps(point), flush=True)
    return points


def runs_of(points: list[dict], fronts: int | str, rows: int, pinned: bool = False) -> list[dict]:
    """The measured runs of one layout at one size, pinned or not, every round (points measured
    before pinning existed were unpinned)."""
    return [
        p
        for p in points
        if p["fronts"] == fronts and p["rows"] == rows and p.get("pinned", False) == pinned
    ]


def pins_of(points: list[dict]) -> list[bool]:
    """Whether unpinned runs, pinned runs or both were measured, unpinned first."""
    return sorted({bool(p.get("pinned", False)) for p in points})


def costs_of(points: list[dict], fronts: int, rows: int, pinned: bool = False) -> CpuCosts:
    """One layout's mean CPU per request by role (the client's too: it shares these cores), at
    ``rows`` rows per request; the serial time of one front (one process) from the runs where
    one front (one process) served alone: 1 / its requests/s."""
    mine = runs_of(points, fronts, rows, pinned)
    us = mean_costs(mine)
    us["client"] = float(np.mean([p["client_us_per_request"] for p in mine]))
    alone = runs_of(points, min(fronts, 1), rows, pinned)
    requests_per_s = float(np.mean([p["rows_per_s"] / rows for p in alone]))
    # the scheduler's CPU, in series with the forwards: the owner's; today's model does the same
    # work inside its one process, where it is not measured apart: the 1-front owner's
    owner = us.get("owner")
    if owner is None:
        split = runs_of(points, 1, rows, pinned)
        owner = float(np.mean([p["cpu_us_per_request"]["owner"] for p in split])) if split else 0.0
    return CpuCosts(us, 1e6 / requests_per_s, owner)


def layout_of(fronts: int) -> Layout:
    return Layout(fronts=fronts) if fronts > 0 else Layout(instances=1)


def pinned_label(label: str, pinned: bool) -> str:
    return f"{label}, pinned" if pinned else label


def pinned_key(key: str, pinned: bool) -> str:
    """A predicted point's key for the runs pinned or not (``one_row``, ``one_row_pinned``)."""
    return f"{key}_pinned" if pinned else key


def validation(data: dict) -> str:
    points = data["points"]
    cores = float(data["cores"])
    rounds = max(p["round"] for p in points)
    lines = [
        f"Measured on this machine ({data['cores']} cores; the client shares them), {rounds} "
        "rounds alternating, zero-time engine (the server's own ceiling), means of the rounds. "
        "Each process's CPU per request is that layout's own, at that size; the serial time of "
        "a front (or of the one process) is measured where one front (one process) serves "
        "alone, so those rows meet their own serial time by construction (marked *): the rows "
        "of 2 fronts are the test. For 2 fronts the prediction from the 1-front costs is shown "
        "too."
        + (
            " Rows marked pinned had their processes on cores of their own (`pin_cores`), "
            "measured alternating with the unpinned ones; with 2 fronts, two fronts and the "
            "owner are three processes on this machine's two cores, so one of them ran unpinned."
            if True in pins_of(points)
            else ""
        ),
        "",
        *predicted_beside_served(points, cores),
    ]
    return "\n".join(lines)


def predicted_beside_served(points: list[dict], cores: float) -> list[str]:
    """The table of each measured point's served rows/s beside its prediction from its own
    costs (and, for 2 fronts, from the 1-front costs)."""
    lines = [
        "| layout | rows per request | clients | served rows/s (each round) | served, mean | predicted rows/s | predicted / served | bound | from the 1-front costs |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for pinned in pins_of(points):
        for fronts in LAYOUTS:
            for rows in ROWS:
                mine = runs_of(points, fronts, rows, pinned)
                if not mine:
                    continue
                served = float(np.mean([p["rows_per_s"] for p in mine]))
                layout = layout_of(fronts)
                guess = predict(
                    [], None, costs_of(points, fronts, rows, pinned), cores, rows, layout
                )
                mark = " *" if fronts <= 1 and guess.bound in ("fronts", "instances") else ""
                other = ""
                if fronts > 1:
                    cross = predict(
                        [], None, costs_of(points, 1, rows, pinned), cores, rows, layout
                    )
                    other = (
                        f"{cross.rows_per_s:.0f} ({cross.rows_per_s / served:.2f}, {cross.bound})"
                    )
                each = ", ".join(f"{p['rows_per_s']:.0f}" for p in mine)
                lines.append(
                    f"| {pinned_label(layout.label(), pinned)} | {rows} | {CLIENTS[rows]} | {each} "
                    f"| {served:.0f} | {guess.rows_per_s:.0f}{mark} | "
                    f"{guess.rows_per_s / served:.2f} | {guess.bound} | {other} |"
                )
    return lines


def owner_in_series(data: dict, lengths: list[int]) -> str:
    """The owner alone over the waiting engine (``measure-owner``), each way it runs its forwards
    beside what the simulator predicts for it from the run's own costs: in line with the
    scheduler thread (``overlap_forwards`` off), all of the owner's CPU in series with the
    forwards; on an engine thread (on, the default where the engine runs on a GPU), its
    scheduler thread's alone."""
    over = data.get("owner_over_table")
    if not over:
        return ""
    overshoot_us = float(over["sleep_overshoot_us"])
    table = slowed_table(cost_table(over["table"]), overshoot_us * 1e-6)
    lines = [
        "What of the owner's CPU runs in series with the GPU's forwards, checked on the owner "
        f"alone (`measure-owner`: pinned to a core, 2 feeder processes as fronts on the other) "
        f"over an engine whose forwards wait the {over['table']} table's time (derived, not a "
        f"GPU; each wait here {overshoot_us:.0f} us longer than asked, given to the simulator "
        "too), at the node's clients, its forwards in line (`overlap_forwards` off) and on an "
        "engine thread (on, the default where the engine runs on a GPU), in alternating rounds; "
        "each predicted from the in-line runs' own CPU per request:",
        "",
        "| rows per request | clients | owner's CPU a request (its scheduler thread's) | overlap off: served rows/s (each round) | mean | predicted, all of the owner in series (/ served) | overlap on: served rows/s (each round) | mean (/ off) | predicted, its scheduler thread in series (/ served) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for rows in OWNER_ROWS:
        runs = over["runs"][str(rows)]
        served = float(np.mean(runs["rows_per_s"]))
        owner, scheduler = (float(np.mean(runs[k])) for k in ("owner_us", "scheduler_us"))
        clients = int(over["clients"][str(rows)])
        in_line, overlapped = (
            predict(
                lengths,
                table,
                CpuCosts({"owner": owner}, 0.0, in_series_us=series),
                1.0,
                rows,
                Layout(fronts=2),
                clients=clients,
            ).rows_per_s
            for series in (owner, scheduler)
        )
        each = ", ".join(f"{x:,.0f}" for x in runs["rows_per_s"])
        if runs.get("overlap_rows_per_s"):
            served_on = float(np.mean(runs["overlap_rows_per_s"]))
            on = (
                ", ".join(f"{x:,.0f}" for x in runs["overlap_rows_per_s"])
                + f" | {served_on:,.0f} ({served_on / served:.2f}x) | "
                f"{overlapped:,.0f} ({overlapped / served_on:.2f})"
            )
        else:
            on = f"not measured | | {overlapped:,.0f}"
        lines.append(
            f"| {rows} | {clients} | {owner:.0f} ({scheduler:.0f}) | {each} | {served:,.0f} | "
            f"{in_line:,.0f} ({in_line / served:.2f}) | {on} |"
        )
    return "\n".join(lines)


def node_costs(
    data: dict,
    layout: Layout,
    rows: int,
    owner_alone: bool = True,
    pinned: bool = False,
    overlap: bool = True,
    series_at_load: bool = True,
) -> CpuCosts:
    """A served node's costs: no client on its cores; K > 2 fronts cost as 2 did (extrapolated);
    the owner at its cost alone on a core of its own (``measure-owner``, pinned there either
    way), or as served on this machine's shared cores; ``pinned``: the costs measured with the
    processes pinned. In series with the forwards: with ``overlap`` (``overlap_forwards``, the
    default where the engine runs on a GPU) the owner's scheduler thread's CPU, what the owner
    alone served with it (``owner_in_series``); without, all of the owner's (a lower estimate
    of what it serves in line: its socket thread runs while a forward waits). Both per request
    as the owner alone spent them over a GPU's table at the node's clients (``series_at_load``:
    the load ``owner_in_series`` checked, where each forward carries tens of rows), or over the
    zero-time engine at this machine's clients (forwards of a few rows: more per row)."""
    fronts = min(layout.fronts, 2) if layout.fronts else 0
    costs = costs_of(data["points"], fronts, rows, pinned).without_client()
    alone = data.get("owner_alone_us", {}).get(str(rows))
    if not owner_alone or alone is None:
        return costs
    us = {**costs.us, "owner": alone} if "owner" in costs.us else costs.us
    at_load = data.get("owner_over_table", {}).get("runs", {}).get(str(rows))
    if series_at_load and at_load:
        series = float(np.mean(at_load["scheduler_us" if overlap else "owner_us"]))
    else:
        series = data["owner_alone_scheduler_us"][str(rows)] if overlap else alone
    return replace(costs, us=us, in_series_us=series)


def node_ceiling(
    lengths: list[int],
    table: CostTable,
    cores: int,
    costs: CpuCosts,
    rows: int,
    layout: Layout,
    policy: str = "dp",
) -> Served:
    """What the node's clients (``NODE_CLIENTS``) in requests of ``rows`` rows get."""
    return predict(lengths, table, costs, cores, rows, layout, policy, clients=NODE_CLIENTS[rows])


def node_predictions(
    lengths: list[int], data: dict, cores: int
) -> tuple[str, list[dict[str, object]]]:
    fronts_counts = (1, 2, 4, 6, 8, 10, 12, 16)
    pins = pins_of(data["points"])
    if False not in pins:
        raise BenchError(
            "the report predicts from unpinned costs first: run `measure --pin-cores off` "
            "(or `both`)"
        )
    pinned_too = True in pins
    plotted: list[dict[str, object]] = []
    lines = []
    for gpu in ("a100", "a30"):
        table = gpu_table(gpu)
        # the node's ceiling on this GPU's table, its clients at that size of request
        on_node = functools.partial(node_ceiling, lengths, table, cores)
        lines += [
            f"**{gpu.upper()}, {cores} cores, one GPU** (forward times derived from NVIDIA's "
            "published TensorRT BERT latencies scaled to MiniLM, not measured on a GPU; CPU "
            "costs measured here, the owner's alone on a core of its own; costs of more than 2 "
            "fronts extrapolated from 2; no client on these cores; `overlap_forwards` on, the "
            "default where the engine runs on a GPU: the owner's scheduler thread's CPU in "
            "series with the forwards"
            + (
                "; pinned: the same from the costs measured pinned (`pin_cores`)"
                if pinned_too
                else ""
            )
            + "):",
            "",
            "| layout | one-row requests (256 clients): rows/s | bound | rows per forward | 64-row requests (16 clients): rows/s | bound |"
            + (
                " pinned: one-row rows/s (bound) | pinned: 64-row rows/s (bound) |"
                if pinned_too
                else ""
            ),
            "|---|---|---|---|---|---|" + ("---|---|" if pinned_too else ""),
        ]
        layouts = [Layout(fronts=k) for k in fronts_counts] + [
            Layout(instances=n) for n in (1, 2, 4, 8)
        ]
        for layout in layouts:
            point: dict[str, object] = {
                "gpu": gpu,
                "layout": layout.label(),
                "fronts": layout.fronts,
                "instances": 0 if layout.fronts else layout.instances,
            }
            row = f"| {layout.label()} |"
            for pinned in pins:
                one, many = (
                    on_node(node_costs(data, layout, r, pinned=pinned), r, layout)
                    for r in NODE_ROWS
                )
                point |= {
                    pinned_key("one_row", pinned): one.rows_per_s,
                    pinned_key("many_rows", pinned): many.rows_per_s,
                }
                row += (
                    f" {one.rows_per_s:,.0f} ({one.bound}) | {many.rows_per_s:,.0f} ({many.bound}) |"
                    if pinned
                    else f" {one.rows_per_s:,.0f} | {one.bound} | {one.rows_per_forward:.1f} | "
                    f"{many.rows_per_s:,.0f} | {many.bound} |"
                )
            plotted.append(point)
            lines.append(row)

        def peer_of(pinned: bool) -> CpuCosts:
            """The peer's CPU: Triton's cost per one-row request alone, as measured here."""
            triton = node_costs(data, Layout(fronts=2), 1, pinned=pinned).of("triton")
            return CpuCosts({"triton": triton}, 0.0)

        peer = peer_of(False)
        triton_us = peer.of("triton")
        allowed = min(cores / (triton_us * 1e-6), peer.triton_ceiling_per_s)
        engine = on_node(CpuCosts({}, 0.0), 64, Layout(peer=True))
        best = default_fronts(True, cores, (0,), 1)
        chosen = Layout(fronts=best)

        compared = {
            (name, rows, pinned): on_node(
                peer_of(pinned)
                if name == "peer"
                else node_costs(data, chosen, rows, pinned=pinned),
                rows,
                Layout(peer=True) if name == "peer" else chosen,
                "dynamic_batcher" if name == "peer" else name,
            )
            for name in ("dp", "per_bucket", "peer")
            for rows in NODE_ROWS
            for pinned in pins
        }
        contended = [
            on_node(node_costs(data, chosen, r, owner_alone=False), r, chosen) for r in NODE_ROWS
        ]
        in_line = [
            on_node(node_costs(data, chosen, r, overlap=False), r, chosen) for r in NODE_ROWS
        ]
        one_row = node_costs(data, chosen, 1)  # the default fronts' costs, one row a request
        mine = [p for p in plotted if p["gpu"] == gpu]
        ours = {
            pinned: max(float(p[pinned_key("one_row", pinned)]) for p in mine)  # type: ignore[arg-type]
            for pinned in pins
        }
        plotted.append(
            {
                "gpu": gpu,
                "layout": "engine alone",
                "many_rows": engine.rows_per_s,
                "triton_allows": allowed,
            }
        )
        pinned_best = (
            f"; pinned, {ours[True]:,.0f} rows/s, {ours[True] / allowed:.0%}" if pinned_too else ""
        )
        lines += [
            "",
            f"- Triton's own cost ({triton_us:.0f} us a one-row request, measured here) and "
            f"ceiling ({TRITON_CEILING_PER_S:,.0f}/s, server#7590) allow {allowed:,.0f} one-row "
            f"requests/s on {cores} cores; the best layout above serves {ours[False]:,.0f} rows/s, "
            f"{ours[False] / allowed:.0%} of that{pinned_best}.",
            *floor_bound(data, cores, allowed, ours),
            f"- The engine alone (no CPU cost at all) serves {engine.rows_per_s:,.0f} rows/s in "
            "64-row requests.",
            f"- With the owner's cost as served on this machine's 2 shared cores instead of alone "
            f"on its own ({node_costs(data, chosen, 1, owner_alone=False).of('owner'):.0f} against "
            f"{one_row.of('owner'):.0f} us a one-row request), the default "
            f"{best} fronts serve {contended[0].rows_per_s:,.0f} and {contended[1].rows_per_s:,.0f}"
            " rows/s (unpinned): the owner's own core is what the split needs most.",
            f"- With `overlap_forwards` off (all of the owner's "
            f"{one_row.of('owner'):.0f} us a one-row request in series with "
            f"the forwards, not only its scheduler thread's "
            f"{one_row.in_series_us:.0f}), the default {best} fronts serve "
            f"{in_line[0].rows_per_s:,.0f} and {in_line[1].rows_per_s:,.0f} rows/s (unpinned): "
            "a lower estimate (the check above).",
            "",
            f"The planner and the peer at the same loads, the default {best} fronts (the peer: "
            "Triton's dynamic batcher in front of its C++ TensorRT backend, whose only CPU is "
            "Triton's, its clients sending token ids: modelled with Triton's cost measured here, "
            "not measured itself"
            + (
                "; pinned: every process's costs measured pinned, Triton's too"
                if pinned_too
                else ""
            )
            + "):",
            "",
            "| requests | DP rows/s (rows a forward) | per-bucket rows/s (rows a forward) | DP / per-bucket | peer rows/s (rows a forward) | DP / peer |",
            "|---|---|---|---|---|---|",
        ]
        for rows in NODE_ROWS:
            for pinned in pins:
                dp, pb, pr = (compared[(n, rows, pinned)] for n in ("dp", "per_bucket", "peer"))
                what = pinned_label(f"{rows} row{'s' if rows > 1 else ''}", pinned)
                lines.append(
                    f"| {what} | {dp.rows_per_s:,.0f} "
                    f"({dp.rows_per_forward:.1f}) | {pb.rows_per_s:,.0f} ({pb.rows_per_forward:.1f}) | "
                    f"{dp.rows_per_s / pb.rows_per_s:.2f} | {pr.rows_per_s:,.0f} "
                    f"({pr.rows_per_forward:.1f}, {pr.bound}) | {dp.rows_per_s / pr.rows_per_s:.2f} |"
                )
        lines.append("")
    return "\n".join(lines), plotted


# the floor's measurements in cpu_costs.json: unpinned, and pinned to a core (pin_cores); what
# the bullet adds to say so, and whether the layouts it is compared with are the pinned ones
FLOOR_KEYS = {
    "floor_us": ("", False),
    "floor_pinned_us": (", its process pinned to a core (`pin_cores`)", True),
}


def floor_allows(us: dict[str, float], cores: int) -> float:
    """Requests/s the floor's CPU (``us`` by process) allows on ``cores``: the cores it takes, or
    Triton's own ceiling."""
    return min(cpu_ceilings(CpuCosts(us, 0.0), cores, Layout(instances=1)).values())


def mean_costs(runs: list[dict]) -> dict[str, float]:
    """CPU us per request by process, the mean of ``runs`` (a process missing from a run: 0)."""
    roles = sorted({role for run in runs for role in run["cpu_us_per_request"]})
    return {
        role: float(np.mean([run["cpu_us_per_request"].get(role, 0.0) for run in runs]))
        for role in roles
    }


def floor_bound(data: dict, cores: int, allowed: float, ours: dict[bool, float]) -> list[str]:
    """A bullet on what the Python backend's floor allows on ``cores`` cores for each way it was
    measured (none before ``measure-floor`` has run), beside ``ours``: the best layout's one-row
    rows/s, unpinned (False) and, where predicted, pinned (True)."""
    lines = []
    for key, (how, pinned) in FLOOR_KEYS.items():
        measured = data.get(key, {})
        floor = measured.get("1")
        if not floor:
            continue
        one = floor_allows(floor, cores)
        many = (
            f" (in 64-row requests, {64 * floor_allows(measured['64'], cores):,.0f} rows/s)"
            if "64" in measured
            else ""
        )
        best = ours.get(pinned)
        compared = (
            f"the best {'pinned ' if pinned else ''}layout above serves {best / one:.0%} of that "
            "bound"
            if best is not None
            else f"the best layout above, unpinned, serves {ours[False] / one:.0%} of that bound"
        )
        lines.append(
            f"- The Python backend's own floor (`measure-floor`: a bench-only model that tokenizes "
            f"each request and answers zeros from a thread, no queue, owner or planner{how}) costs "
            f"{sum(floor.values()):.0f} us a one-row request here (Triton {floor['triton']:.0f}, "
            f"its stub {floor['model']:.0f}): {cores} cores carry at most {one:,.0f} one-row "
            f"requests/s of any design that answers each request from a Python-backend stub"
            f"{many}, {one / allowed:.0%} of what Triton's own cost allows; {compared}."
        )
    return lines


def token_id_clients(lengths: list[int], data: dict, cores: int) -> str:
    """What one-row clients that send token ids (``measure-ids``) get: measured here beside the
    floor, then the node's prediction beside the same clients sending text, the peer (whose
    clients send token ids, with Triton's cost measured for token ids) and the floor's bound;
    empty before ``measure-ids`` has run."""
    points = data.get("token_id_points")
    if not points:
        return ""
    from bench.fronts import FLOOR

    ids = data | {"points": points}
    pins = pins_of(points)
    rounds = max(p["round"] for p in points)
    lines = [
        "### Clients that send token ids",
        "",
        "One-row requests whose clients tokenize and send INPUT_IDS (the same rows the fronts "
        "make of the texts; the server tokenizes nothing), measured here with `measure-ids` "
        f"({rounds} rounds alternating, c={CLIENTS[1]}, zero-time engine; the floor: the "
        "bench-only model that answers zeros, reading the ids):",
        "",
        "| layout | served rows/s (each round) | server CPU us/request (by process) |",
        "|---|---|---|",
    ]
    for pinned in pins:
        for fronts in (*LAYOUTS, FLOOR):
            mine = runs_of(points, fronts, 1, pinned)
            if not mine:
                continue
            us = mean_costs(mine)
            name = "Python-backend floor" if fronts == FLOOR else layout_of(int(fronts)).label()
            each = ", ".join(f"{p['rows_per_s']:.0f}" for p in mine)
            lines.append(
                f"| {pinned_label(name, pinned)} | {each} "
                f"| {sum(us.values()):.0f} ({', '.join(f'{r} {v:.0f}' for r, v in us.items())}) |"
            )
    best = default_fronts(True, cores, (0,), 1)
    best_measured = min(best, 2)  # the fronts whose costs a node of ``best`` is predicted from
    lines += [
        "",
        "Predicted beside served on this machine, as for text clients above (the 2-front rows "
        "the test; the floor is not a layout the model predicts):",
        "",
        *predicted_beside_served(points, float(data["cores"])),
        "",
        f"On {cores} cores with one GPU, 256 one-row clients (the GPU's forward times derived, "
        "not measured; the text columns from `measure`'s costs, another run; costs of more "
        "than 2 fronts extrapolated from 2; the peer: Triton's C++ backend, its CPU Triton's "
        "cost per request as measured here behind fronts fed token ids, not measured itself):",
        "",
        f"| GPU | costs | text, the default {best} fronts: rows/s | token ids, the default {best} fronts: rows/s (bound) | token ids, best of 1-16 fronts: rows/s (fronts) | of Triton's allowance | peer rows/s | token ids / peer | the floor's bound with token ids (of the allowance) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for gpu in ("a100", "a30"):
        table = gpu_table(gpu)
        for pinned in pins:
            on_node = functools.partial(node_ceiling, lengths, table, cores)
            chosen = Layout(fronts=best)
            text = (
                f"{on_node(node_costs(data, chosen, 1, pinned=pinned), 1, chosen).rows_per_s:,.0f}"
                if runs_of(data["points"], best_measured, 1, pinned)
                else "not measured"
            )
            served = on_node(node_costs(ids, chosen, 1, pinned=pinned), 1, chosen)
            top = max(
                (
                    (
                        on_node(
                            node_costs(ids, Layout(fronts=k), 1, pinned=pinned), 1, Layout(fronts=k)
                        ),
                        k,
                    )
                    for k in (1, 2, 4, 6, 8, 10, 12, 14, 16)
                ),
                key=lambda served_k: served_k[0].rows_per_s,
            )
            triton = node_costs(ids, Layout(fronts=2), 1, pinned=pinned).of("triton")
            peer_costs = CpuCosts({"triton": triton}, 0.0)
            allowed = min(cores / (triton * 1e-6), peer_costs.triton_ceiling_per_s)
            peer = on_node(peer_costs, 1, Layout(peer=True), "dynamic_batcher")
            floor = runs_of(points, FLOOR, 1, pinned)
            bound = floor_allows(mean_costs(floor), cores) if floor else float("nan")
            lines.append(
                f"| {gpu.upper()} | {'pinned' if pinned else 'unpinned'} | {text} "
                f"| {served.rows_per_s:,.0f} ({served.bound}) | {top[0].rows_per_s:,.0f} ({top[1]}) "
                f"| {top[0].rows_per_s / allowed:.0%} of {allowed:,.0f} | {peer.rows_per_s:,.0f} "
                f"| {served.rows_per_s / peer.rows_per_s:.2f} | {bound:,.0f} ({bound / allowed:.0%}) |"
            )
    return "\n".join(lines)


def plot(plotted: list[dict[str, object]], path: Path = PLOT) -> Path:
    """Predicted rows/s against fronts per GPU, per GPU table and load, with today's layout
    (instances) and the engine alone as references."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 5.6))
    for ax, key, title in (
        (axes[0], "one_row", "one-row requests"),
        (axes[1], "many_rows", "64-row requests"),
    ):
        for gpu, style in (("a100", "-"), ("a30", "--")):
            mine = [p for p in plotted if p["gpu"] == gpu]
            for by, pinned, marker, color, what in (
                ("fronts", False, "o", None, "K fronts, one owner"),
                ("fronts", True, "^", None, "K fronts, one owner, pinned"),
                ("instances", False, "s", "gray", "today's N instances, each its own queue"),
            ):
                series = [p for p in mine if p.get(by) and pinned_key(key, pinned) in p]
                if not series:
                    continue
                ax.plot(
                    [p[by] for p in series],
                    [p[pinned_key(key, pinned)] for p in series],
                    style,
                    marker=marker,
                    color=color,
                    label=f"{gpu.upper()}: {what}",
                )
            ref = next(p for p in mine if p["layout"] == "engine alone")
            level, color, what = (
                (ref["many_rows"], "green", "the engine alone")
                if key == "many_rows"
                else (ref["triton_allows"], "red", "Triton's own limit")
            )
            ax.axhline(
                level, linestyle=style, color=color, alpha=0.6, label=f"{gpu.upper()}: {what}"
            )
        ax.set_xlabel("fronts (or today's instances) per GPU")
        ax.set_ylabel("predicted rows/s")
        ax.set_title(f"16 cores, one GPU, {title}")
        ax.grid(True, alpha=0.3)
        # below the panel: inside it, it covered the lines it names
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2)
    return save_figure(fig, path)


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "what", choices=("measure", "measure-owner", "measure-floor", "measure-ids", "report")
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=5000)
    parser.add_argument("--cores", type=int, default=16, help="the node the report predicts")
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument(
        "--pin-cores",
        choices=tuple(PINS),
        default="off",
        help="measure: the variants unpinned, pinned to cores of their own (pin_cores), or both "
        "alternating; measure-floor: the floor pinned (on) or not, each kept beside the other",
    )
    args = parser.parse_args(argv)
    if args.what == "measure":
        # the owner's and the floor's measurements, kept
        kept = json.loads(COSTS_FILE.read_text()) if COSTS_FILE.exists() else {}
        data = kept | measure(
            args.rounds, args.measurement_ms, args.repository, PINS[args.pin_cores]
        )
        COSTS_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"written: {COSTS_FILE.relative_to(ROOT)}")
    data = json.loads(COSTS_FILE.read_text())
    if args.what == "measure-owner":
        data |= measure_owner_alone(args.rounds, args.measurement_ms / 1000)
    if args.what == "measure-floor":
        for pinned in PINS[args.pin_cores]:
            key = "floor_pinned_us" if pinned else "floor_us"
            data[key] = measure_floor(args.rounds, args.measurement_ms, args.repository, pinned)
    if args.what == "measure-ids":
        data["token_id_points"] = measure_token_ids(
            args.rounds, args.measurement_ms, args.repository, PINS[args.pin_cores]
        )
    if args.what in ("measure-owner", "measure-floor", "measure-ids"):
        COSTS_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"written: {COSTS_FILE.relative_to(ROOT)}")
    table = validation(data)
    lengths = read_lengths(LENGTHS)
    owner = owner_in_series(data, lengths)
    node, plotted = node_predictions(lengths, data, args.cores)
    token_ids = token_id_clients(lengths, data, args.cores)
    plot(plotted)
    text = (
        "## The server's CPU, modelled\n\n"
        "    python -m bench.cpu_model measure --pin-cores both  # bench/data/cpu_costs.json\n"
        "    python -m bench.cpu_model measure-owner         # the owner alone on a core\n"
        "    python -m bench.cpu_model measure-floor --pin-cores both  # the Python backend's floor\n"
        "    python -m bench.cpu_model measure-ids --pin-cores both  # clients that send token ids\n"
        "    python -m bench.cpu_model report               # this section, docs/cpu_model.png\n\n"
        "The simulator's CPU model (`bench/sim/cpu.py`): the server's cores shared by Triton, the "
        "fronts, the queue owner (its transport included) and, here, the client; each front "
        "bounded by its serial time per request; the owner's CPU in series with the GPU's "
        "forwards (with `overlap_forwards`, its scheduler thread's), which the simulator steps "
        "through the project's own scheduler.\n\n"
        + table
        + "\n\n"
        + (owner + "\n\n" if owner else "")
        + node
        + "\nWhere the GPU binds, its ceiling is what the simulated engine serves to the node's "
        "clients in a closed loop (256 one-row clients, 16 of 64-row requests; each of today's "
        "N instances gets 1/N of them), all of them waiting in the owner's queue (the time "
        "each spends in the fronts left out), the owner's scheduler thread's CPU in series "
        "with each forward. "
        "Rows per forward, where the CPU binds, are those of an open loop at the CPU's rate.\n"
        + "\n![predicted rows/s against fronts per GPU](cpu_model.png)\n"
        + ("\n" + token_ids + "\n" if token_ids else "")
    )
    print(text)
    write_section(text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
