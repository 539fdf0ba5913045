"""The simulator's CPU model (bench.sim.cpu), measured, validated and used on this machine.

    python -m bench.cpu_model measure [--rounds 3] [--measurement-ms 5000]
    python -m bench.cpu_model report

``measure`` serves the bench model over the emulated engine with a zero table (forwards take
no time: the server around the engine, its ceiling at GPU speed) on the real Triton, at 1, 8
and 64 rows per request (64, 32 and 8 clients: 64, 256 and 512 rows in flight), as today's one
process and as the split layout with 1 and 2 fronts, variants alternating in an order that flips
every round; for each point it records the served rows/s and every server process's CPU per
request from /proc (``bench.fronts.serve_once``), and the rest of the machine's busy CPU (the
client). It writes them to bench/data/cpu_costs.json.

``report`` fits each process's cost per request (``a + b x rows``) on the 1-front runs at 1 and
64 rows (and today's model on its own runs), predicts every measured point from them with this
machine's cores, prints predicted beside served, then predicts a 16-core node with one GPU
(derived A100 and A30 tables, no client on its cores) and writes both to docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import numpy as np

from bench.cost_tables import gpu_table, read_lengths
from bench.docs import write_section
from bench.errors import reports_errors
from bench.paths import LENGTHS, ROOT
from bench.sim.cpu import CpuCosts, Layout, ProcessCost, predict

COSTS_FILE = ROOT / "bench" / "data" / "cpu_costs.json"
BEGIN, END = "<!-- cpu-model:begin -->", "<!-- cpu-model:end -->"
ROWS = (1, 8, 64)
CLIENTS = {1: 64, 8: 32, 64: 8}  # 64, 256 and 512 rows in flight
LAYOUTS = (0, 1, 2)  # today's one process, then 1 and 2 fronts (bench.fronts.variant)
CALIBRATION_FRONTS = 1
CALIBRATION_ROWS = (1, 64)


def measure(rounds: int, ms: int, repository: Path) -> dict[str, object]:
    from bench.fronts import serve_once
    from bench.harness import build_repository

    repository, _ = build_repository(repository, rebuild=False)
    points: list[dict[str, object]] = []
    order = [(fronts, rows) for rows in ROWS for fronts in LAYOUTS]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for fronts, rows in order if r % 2 == 0 else order[::-1]:
                served = serve_once(repository, fronts, CLIENTS[rows], rows, Path(tmp), ms, "zero")
                point = {
                    "round": r + 1,
                    "fronts": fronts,
                    "rows": rows,
                    "clients": CLIENTS[rows],
                    "rows_per_s": served.rows_per_s,
                    "cpu_us_per_request": served.cpu_us_per_request,
                    "client_us_per_request": served.other_us_per_request,
                    "stable": served.stable,
                }
                points.append(point)
                print(json.dumps(point), flush=True)
    return {"cores": os.cpu_count(), "measurement_ms": ms, "points": points}


def mean_by(points: list[dict], key: str) -> dict[tuple[int, int], float]:
    groups: dict[tuple[int, int], list[float]] = defaultdict(list)
    for p in points:
        groups[(p["fronts"], p["rows"])].append(float(p[key]))
    return {k: float(np.mean(v)) for k, v in groups.items()}


def role_costs(points: list[dict], fronts: int, rows: tuple[int, ...]) -> CpuCosts:
    """Each role's cost line, fitted on the runs of one layout at the given rows per request;
    the client too (it shares these cores)."""
    by_role: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for p in points:
        if p["fronts"] != fronts or p["rows"] not in rows:
            continue
        for role, us in {**p["cpu_us_per_request"], "client": p["client_us_per_request"]}.items():
            by_role[role][p["rows"]].append(float(us))
    return CpuCosts(
        {
            role: ProcessCost.fitted({r: float(np.mean(v)) for r, v in by_rows.items()})
            for role, by_rows in by_role.items()
        }
    )


def layout_of(fronts: int) -> Layout:
    return Layout(fronts=fronts) if fronts > 0 else Layout(instances=1)


def validation(data: dict) -> tuple[str, CpuCosts, CpuCosts]:
    points = data["points"]
    cores = float(data["cores"])
    split = role_costs(points, CALIBRATION_FRONTS, CALIBRATION_ROWS)
    single = role_costs(points, 0, CALIBRATION_ROWS)
    served = mean_by(points, "rows_per_s")
    lines = [
        f"Measured on this machine ({data['cores']} cores), {max(p['round'] for p in points)} "
        "rounds; each process's cost per request fitted on the runs marked (fit): the split "
        f"layout's on {CALIBRATION_FRONTS} front at {' and '.join(map(str, CALIBRATION_ROWS))} "
        "rows, today's on its own runs at the same sizes. Zero-time engine: the server's own "
        "ceiling.",
        "",
        "| layout | rows per request | clients | served rows/s (mean) | predicted rows/s | predicted / served | bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for (fronts, rows), rate in sorted(served.items()):
        costs = split if fronts > 0 else single
        guess = predict([], None, costs, cores, rows, layout_of(fronts), CLIENTS[rows])
        fitted = rows in CALIBRATION_ROWS and fronts in (0, CALIBRATION_FRONTS)
        lines.append(
            f"| {layout_of(fronts).label()} | {rows}{' (fit)' if fitted else ''} | "
            f"{CLIENTS[rows]} | {rate:.0f} | {guess.rows_per_s:.0f} | "
            f"{guess.rows_per_s / rate:.2f} | {guess.bound} |"
        )
    return "\n".join(lines), split, single


def predictions(lengths: list[int], split: CpuCosts, single: CpuCosts, cores: int) -> str:
    lines = []
    node_split, node_single = split.without_client(), single.without_client()
    peer = CpuCosts({"triton": node_split.roles["triton"]})
    for gpu in ("a100", "a30"):
        table = gpu_table(gpu)
        lines += [
            f"**{gpu.upper()}** (forward times derived from NVIDIA's published TensorRT BERT "
            "latencies, scaled to MiniLM: not measured on a GPU), one GPU, "
            f"{cores} cores, no client on them:",
            "",
            "| layout | 256 one-row clients: rows/s | bound | rows/forward | 64-row requests (8 clients): rows/s | bound |",
            "|---|---|---|---|---|---|",
        ]
        layouts = [Layout(fronts=k) for k in (1, 2, 4, 8, 12, 16)] + [
            Layout(instances=n) for n in (1, 2, 4)
        ]
        for layout in layouts:
            costs = node_split if layout.fronts else node_single
            one = predict(lengths, table, costs, cores, 1, layout, 256)
            many = predict(lengths, table, costs, cores, 64, layout, 8)
            lines.append(
                f"| {layout.label()} | {one.rows_per_s:,.0f} | {one.bound} | "
                f"{one.rows_per_forward:.1f} | {many.rows_per_s:,.0f} | {many.bound} |"
            )
        peer_one = predict(
            lengths, table, peer, cores, 1, Layout(peer=True), 256, "dynamic_batcher"
        )
        engine = predict(lengths, table, CpuCosts({}), cores, 64, Layout(peer=True), 8)
        lines += [
            f"| {Layout(peer=True).label()} | {peer_one.rows_per_s:,.0f} | {peer_one.bound} | "
            f"{peer_one.rows_per_forward:.1f} | | |",
            "",
            f"Triton's own per-request cost ({node_split.roles['triton'].us(1):.0f} us a "
            f"one-row request, measured here) and ceiling allow "
            f"{min(cores / (node_split.roles['triton'].us(1) * 1e-6), peer.triton_ceiling_per_s):,.0f}"
            f" one-row requests/s on {cores} cores; the engine alone serves "
            f"{engine.rows_per_s:,.0f} rows/s in 64-row requests.",
            "",
        ]
    return "\n".join(lines)


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("measure", "report"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--measurement-ms", type=int, default=5000)
    parser.add_argument("--cores", type=int, default=16, help="the node the report predicts")
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    args = parser.parse_args(argv)
    if args.what == "measure":
        data = measure(args.rounds, args.measurement_ms, args.repository)
        COSTS_FILE.write_text(json.dumps(data, indent=1) + "\n")
        print(f"written: {COSTS_FILE.relative_to(ROOT)}")
    data = json.loads(COSTS_FILE.read_text())
    table, split, single = validation(data)
    text = (
        "## The server's CPU, modelled\n\n    python -m bench.cpu_model measure --rounds 3\n"
        "    python -m bench.cpu_model report\n\n"
        + table
        + "\n\n"
        + predictions(read_lengths(LENGTHS), split, single, args.cores)
    )
    print(text)
    write_section(text, BEGIN, END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
