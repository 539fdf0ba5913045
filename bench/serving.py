"""Serving benchmark: the planner model beside Triton's dynamic batcher, on one engine, one run.

    python -m bench.serving [--concurrency 1,2,4,8,16,32,64] [--measurement-ms 4000] [--rebuild]

One Triton server holds three models over the same engine files (built from the real-text
sample, buckets chosen from its lengths):
- planner_dp: this project's model (own queue, DP planner, bucketed forwards);
- planner_per_bucket: the same queue with the planner swapped for per-bucket grouping;
- dynamic_batcher: the peer a user would write: Triton's dynamic batcher, every batch padded to
  its longest row, one forward per batch.
perf_analyzer sends the same requests (bench/data/perf_input.json, one real-text row each) to
each model in turn at each concurrency. The engine-only limit runs the same rows straight through
the engine in the planner's groups, with no server. Results go to docs/PERFORMANCE.md (between
markers) and docs/serving_throughput_p99.png.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.docs import render, write_section
from bench.errors import reports_errors
from bench.harness import (
    MODELS,
    PEER,
    PEER_QUEUE_DELAY_US,
    LoadPoint,
    add_emulated_variant,
    build_repository,
    loopback_door,
    measure,
    print_point,
    request_rows,
    start_body_check,
    warm_up,
)
from bench.paths import DOC, ROOT
from tools.front_door import FrontDoor
from tools.perf_analyzer import PerfPoint
from tools.triton_server import TritonServer, free_port

PLOT = ROOT / "docs" / "serving_throughput_p99.png"
BEGIN, END = "<!-- serving:begin -->", "<!-- serving:end -->"
DOOR_BEGIN, DOOR_END = "<!-- front-door:begin -->", "<!-- front-door:end -->"


def engine_only_limit(
    version_dir: Path, rows: list[np.ndarray], collection: int, rounds: int = 2
) -> float:
    """Rows/s of the same rows run through the scheduler's own step, in collections of
    ``collection`` rows, with no server: the planner's forwards on the engine, nothing else."""
    from python_backend.common.manifest import load_manifest
    from python_backend.engines import open_engine
    from python_backend.scheduling.records import Request
    from python_backend.scheduling.scheduler import Scheduler

    manifest = load_manifest(version_dir)
    engine = open_engine(manifest, version_dir)
    scheduler = Scheduler(
        engine, manifest.pad_token_id, manifest.planner_cost(), manifest.max_batch, len(rows)
    )
    started = time.perf_counter()
    for _ in range(rounds):
        for a in range(0, len(rows), collection):
            for row in rows[a : a + collection]:
                scheduler.submit(Request([row], respond=lambda outcome: None))
            scheduler.step()
    seconds = time.perf_counter() - started
    engine.close()
    return rounds * len(rows) / seconds


def histogram(lengths: list[int]) -> str:
    edges = [0, 16, 32, 64, 128, 192, 256]
    lines = ["| tokens | rows | share |", "|---|---|---|"]
    arr = np.asarray(lengths)
    for lo, hi in itertools.pairwise(edges):
        n = int(((arr > lo) & (arr <= hi)).sum())
        lines.append(f"| {lo + 1}-{hi} | {n} | {n / len(arr):.0%} |")
    return "\n".join(lines)


def plot(results: dict[str, list[LoadPoint]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for model, points in results.items():
        xs = [p.point.p99_ms for p in points]
        ys = [p.point.rows_per_s for p in points]
        ax.plot(xs, ys, marker="o", label=model)
        for p in points:
            ax.annotate(
                str(p.concurrency),
                (p.point.p99_ms, p.point.rows_per_s),
                fontsize=7,
                textcoords="offset points",
                xytext=(3, 3),
            )
    ax.set_xscale("log")
    ax.set_xlabel("p99 latency (ms, log scale); labels: concurrency")
    ax.set_ylabel("throughput (rows/s)")
    ax.set_title("MiniLM on ONNX Runtime (2 CPU cores), real-text rows")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


ROUTES = ("direct", "door, no body check", "front door")


def front_door_comparison(
    server: TritonServer, tmp: Path, ms: int, concurrency: int = 64, rounds: int = 3
) -> list[tuple[str, PerfPoint, bool]]:
    """planner_dp at one concurrency on Triton's own gRPC port, through a front door whose
    inference calls go straight to Triton (the door before the body check), and through the
    front door as it runs (the body check in front of Triton); routes alternating, in an order
    that flips every round, so that the shared machine's drift falls on all alike."""
    check_ports = (free_port(), free_port())
    plain = loopback_door(server, free_port())  # no adapter: /v1 is not measured here
    checked = loopback_door(server, free_port(), check_ports)
    out = []
    with contextlib.ExitStack() as stack:
        check = start_body_check(server, check_ports, tmp / "body_check.log")
        stack.callback(check.stop)
        stack.enter_context(FrontDoor(plain, tmp / "front-door-plain"))
        stack.enter_context(FrontDoor(checked, tmp / "front-door"))
        urls = dict(
            zip(
                ROUTES,
                (server.grpc_url, f"127.0.0.1:{plain.grpc_port}", f"127.0.0.1:{checked.grpc_port}"),
                strict=True,
            )
        )
        for r in range(rounds):
            for route in ROUTES if r % 2 == 0 else ROUTES[::-1]:
                row, stable = measure("planner_dp", urls[route], concurrency, tmp, ms)
                out.append((route, row, stable))
                print_point(f"c={concurrency} planner_dp {route:<20}", row)
    return out


def front_door_report(runs: list[tuple[str, PerfPoint, bool]], concurrency: int, ms: int) -> str:
    table = [
        "| round | route | rows/s | p50 ms | p99 ms |",
        "|---|---|---|---|---|",
    ]
    for k, (route, row, stable) in enumerate(runs):
        table.append(
            f"| {k // len(ROUTES) + 1} | {route} | {row.rows_per_s:.1f} | "
            f"{row.p50_ms:.0f} | {row.p99_ms:.0f} |" + unstable_mark(stable)
        )
    mean = {
        route: float(np.mean([r.rows_per_s for name, r, _ in runs if name == route]))
        for route in ROUTES
    }
    direct, plain, door = (mean[route] for route in ROUTES)
    return render(
        "front_door",
        ms=ms,
        concurrency=concurrency,
        table="\n".join(table),
        direct=f"{direct:.1f}",
        plain=f"{plain:.1f}",
        door=f"{door:.1f}",
        ratio=f"{door / direct:.3f}x",
        check_ratio=f"{door / plain:.3f}x",
    )


def unstable_mark(stable: bool) -> str:
    return "" if stable else " (unstable)"


def emulated_runs(
    repository: Path, table: str, tmp: Path, ms: int, levels: list[int]
) -> list[tuple[int, PerfPoint, bool]]:
    """planner_dp's queue and planner over an emulated engine (bench/emulated_engine.py) whose
    forwards take ``table``'s time ("zero": none): the server's own ceiling at GPU speed."""
    add_emulated_variant(repository, "planner_dp", "planner_emulated", table)
    server = TritonServer(
        repository, free_port(), free_port(), free_port(), log_path=tmp / "triton-emulated.log"
    )
    out = []
    with server:
        warm_up(server, tmp, ("planner_emulated",), max(levels))
        for c in levels:
            row, stable = measure("planner_emulated", server.grpc_url, c, tmp, ms)
            out.append((c, row, stable))
            print_point(f"c={c:>3} emulated {table:<10}", row)
    return out


def code_comparison(
    repository: Path, baseline_root: Path, tmp: Path, ms: int, levels: list[int], rounds: int = 3
) -> list[tuple[int, str, PerfPoint, bool]]:
    """planner_dp served by this checkout's code and by ``baseline_root``'s, on the same
    repository (the same engine files). Both servers run at once, the idle one asleep; each
    measurement of one is followed by the same measurement of the other, in an order that flips
    every time, so the shared machine's drift falls on both alike. Returns (concurrency, which,
    row, stable)."""
    codes = {"this checkout": ROOT, "baseline": baseline_root.resolve()}
    servers = {
        which: TritonServer(
            repository,
            free_port(),
            free_port(),
            free_port(),
            log_path=tmp / f"triton-{which.replace(' ', '-')}.log",
            code_root=code_root,
        )
        for which, code_root in codes.items()
    }
    out = []
    with contextlib.ExitStack() as stack:
        for server in servers.values():
            stack.enter_context(server)
            warm_up(server, tmp, ("planner_dp",), max(levels))
        pairs = [(k, c) for k in range(rounds) for c in levels]
        for n, (_, c) in enumerate(pairs):
            order = list(servers.items()) if n % 2 == 0 else list(servers.items())[::-1]
            for which, server in order:
                row, stable = measure("planner_dp", server.grpc_url, c, tmp, ms)
                out.append((c, which, row, stable))
                print_point(f"c={c:>3} {which:<14}", row)
    return out


def code_comparison_report(
    runs: list[tuple[int, str, PerfPoint, bool]], baseline_root: Path, levels: list[int], ms: int
) -> str:
    table = [
        "| concurrency | code | rows/s (each round) | mean rows/s | p99 ms (mean) | vs baseline |",
        "|---|---|---|---|---|---|",
    ]
    for c in levels:
        means = {}
        for which in ("baseline", "this checkout"):
            rows = [r for cc, w, r, _ in runs if cc == c and w == which]
            rates = [r.rows_per_s for r in rows]
            means[which] = float(np.mean(rates))
            p99 = float(np.mean([r.p99_ms for r in rows]))
            ratio = means[which] / means["baseline"]
            table.append(
                f"| {c} | {which} | {', '.join(f'{x:.1f}' for x in rates)} | {means[which]:.1f} "
                f"| {p99:.0f} | {ratio:.3f}x |"
            )
    return render(
        "code_comparison",
        baseline=baseline_root,
        levels=",".join(map(str, levels)),
        ms=ms,
        rounds=len(runs) // (2 * len(levels)),
        warm_concurrency=max(levels),
        table="\n".join(table),
    )


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,2,4,8,16,32,64")
    parser.add_argument("--measurement-ms", type=int, default=4000)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the bench model")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="only this: planner_dp served by this checkout's code and by another checkout's "
        "(e.g. a worktree of the previous commit), side by side",
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="rounds of the side-by-side comparisons"
    )
    parser.add_argument(
        "--emulated",
        default=None,
        help="only this: planner_dp over an emulated engine whose forwards take this table's "
        "time (zero, or table:a30 ...): the server's own ceiling at GPU speed",
    )
    parser.add_argument(
        "--front-door-only",
        action="store_true",
        help="only the front door's cost: direct against through the front door at c=64",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    repository, build_summary = build_repository(args.repository, args.rebuild)
    version = repository / "planner_dp" / "1"
    rows = request_rows(version)
    lengths = [len(r) for r in rows]
    mean_tokens = float(np.mean(lengths))
    print("\n".join(build_summary))
    print(
        f"{len(rows)} requests of one row; tokens: mean {mean_tokens:.1f}, median "
        f"{np.median(lengths):.0f}, p90 {np.percentile(lengths, 90):.0f}, max {max(lengths)}"
    )

    results: dict[str, list[LoadPoint]] = {m: [] for m in MODELS}
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(
            repository, free_port(), free_port(), free_port(), log_path=Path(tmp) / "triton.log"
        )
        if args.emulated is not None:
            for c, row, _ in emulated_runs(
                repository, args.emulated, Path(tmp), args.measurement_ms, levels
            ):
                print(
                    f"| {c} | {args.emulated} | {row.rows_per_s:.1f} | "
                    f"{1e6 / row.rows_per_s:.0f} us |"
                )
            return 0
        if args.baseline_tree is not None:
            code_runs = code_comparison(
                repository, args.baseline_tree, Path(tmp), args.measurement_ms, levels, args.rounds
            )
            print(
                code_comparison_report(code_runs, args.baseline_tree, levels, args.measurement_ms)
            )
            return 0
        if args.front_door_only:
            with server:
                warm_up(server, Path(tmp), ("planner_dp",), 64)
                runs = front_door_comparison(
                    server, Path(tmp), args.measurement_ms, rounds=args.rounds
                )
            text = front_door_report(runs, 64, args.measurement_ms)
            print(text)
            if not args.no_write:
                write_doc(text, DOOR_BEGIN, DOOR_END)
            return 0
        limit = engine_only_limit(version, rows, collection=max(levels))
        print(f"engine-only limit: {limit:.1f} rows/s ({limit * mean_tokens:.0f} real tokens/s)")
        with server:
            warm_up(server, Path(tmp), MODELS)
            for c in levels:
                for model in MODELS:
                    row, stable = measure(model, server.grpc_url, c, Path(tmp), args.measurement_ms)
                    results[model].append(LoadPoint(c, row, stable))
                    print_point(f"c={c:>3} {model:<19}", row)
            # the same offered load for both: half the peer's peak, which both can sustain
            half_load = 0.5 * max(p.point.rows_per_s for p in results[PEER])
            at_half = {}
            for model in ("planner_dp", PEER):
                row, stable = measure(
                    model, server.grpc_url, 1, Path(tmp), args.measurement_ms, rate=half_load
                )
                at_half[model] = LoadPoint(1, row, stable)
                print_point(f"rate {half_load:.1f}/s {model:<19}", row)
            runs = front_door_comparison(server, Path(tmp), args.measurement_ms, rounds=args.rounds)
            from bench.openai_cost import openai_comparison

            openai_runs = openai_comparison(
                server, Path(tmp), args.measurement_ms / 1000, args.rounds
            )
    text = report(
        results,
        limit,
        lengths,
        build_summary,
        levels,
        args.measurement_ms,
        half_load,
        at_half,
    )
    door = front_door_report(runs, 64, args.measurement_ms)
    from bench import openai_cost

    openai = openai_cost.report(openai_runs, 64, args.measurement_ms / 1000)
    print(text + "\n\n" + door + "\n\n" + openai)
    if not args.no_write:
        plot(results, PLOT)
        write_doc(text)
        write_doc(door, DOOR_BEGIN, DOOR_END)
        write_doc(openai, openai_cost.BEGIN, openai_cost.END)
    return 0


def report(
    results: dict[str, list[LoadPoint]],
    limit: float,
    lengths: list[int],
    build_summary: list[str],
    levels: list[int],
    ms: int,
    half_rate: float,
    at_half: dict[str, LoadPoint],
) -> str:
    mean_tokens = float(np.mean(lengths))
    peer = {p.concurrency: p.point for p in results[PEER]}
    table = [
        "| concurrency | model | rows/s | real tokens/s | p50 ms | p90 ms | p99 ms "
        "| rows/s vs peer | p99 vs peer |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in levels:
        for model in MODELS:
            measured = next(x for x in results[model] if x.concurrency == c)
            p = measured.point
            table.append(
                f"| {c} | {model} | {p.rows_per_s:.1f} | {p.rows_per_s * mean_tokens:.0f} | "
                f"{p.p50_ms:.0f} | {p.p90_ms:.0f} | {p.p99_ms:.0f} | "
                f"{p.rows_per_s / peer[c].rows_per_s:.2f}x | {p.p99_ms / peer[c].p99_ms:.2f}x |"
                + unstable_mark(measured.stable)
            )
    best = max(p.point.rows_per_s for p in results["planner_dp"])
    return render(
        "serving",
        levels=",".join(map(str, levels)),
        ms=ms,
        machine=platform.machine(),
        cores=os.cpu_count(),
        peer_delay_us=PEER_QUEUE_DELAY_US,
        build_summary="\n".join("    " + line for line in build_summary),
        rows=len(lengths),
        mean_tokens=f"{mean_tokens:.1f}",
        histogram=histogram(lengths),
        table="\n".join(table),
        collection=max(levels),
        limit=f"{limit:.1f}",
        limit_tokens=f"{limit * mean_tokens:.0f}",
        efficiency=f"{best / limit:.0%}",
        half_rate=f"{half_rate:.1f}",
        half_load_table=half_load_table(at_half),
    )


def half_load_table(at_half: dict[str, LoadPoint]) -> str:
    lines = ["| model | p50 ms | p99 ms | p99 vs peer |", "|---|---|---|---|"]
    for model, measured in at_half.items():
        p = measured.point
        lines.append(
            f"| {model} | {p.p50_ms:.0f} | {p.p99_ms:.0f} | "
            f"{p.p99_ms / at_half[PEER].point.p99_ms:.2f}x |" + unstable_mark(measured.stable)
        )
    return "\n".join(lines)


def write_doc(section: str, begin: str = BEGIN, end: str = END) -> None:
    write_section(section, begin, end, DOC)


if __name__ == "__main__":
    sys.exit(main())
