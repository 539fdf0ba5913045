"""A discrete-event simulation of the server in virtual time, driving the project's own scheduler.

    python -m bench.simulate --lengths bench/data/request_lengths.txt --cost table:a30 \\
        --policy dp --concurrency 64 --seconds 60

What runs is ``python_backend.scheduling.scheduler.Scheduler`` itself, step by step on a virtual clock,
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
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from bench.cost_tables import (
    cost_table,
    gpu_table,
    linear_table,
    read_lengths,
    report_gpu_tables,
)
from bench.docs import render, save_figure, write_section
from bench.errors import reports_errors
from bench.paths import LENGTHS, ROOT
from bench.sim.policies import POLICIES
from bench.sim.run import best_under_slo, simulate
from bench.sim.validation import server_time_per_row, validate

BEGIN, END = "<!-- simulate:begin -->", "<!-- simulate:end -->"
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
    return save_figure(fig, path)


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
    for gpu, table in report_gpu_tables():
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
    return render(
        "simulate",
        validation=validation,
        sources="\n".join(f"- {gpu}: {table.source}" for gpu, table in report_gpu_tables()),
        us_per_row=f"{us_per_row:.0f}",
        gain_table=gain_by_fixed_cost(lengths, us_per_row),
        slo_ms=f"{slo_ms:.0f}",
        slo_table=throughput_under_slo(lengths, us_per_row, slo_ms),
        wait_table=bounded_wait(lengths, us_per_row),
    )


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=Path, default=LENGTHS)
    parser.add_argument(
        "--cost",
        default="table:a30",
        help="manifest:DIR, table:a100|a30, or table:FILE (a cost table gpu_check measured)",
    )
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
