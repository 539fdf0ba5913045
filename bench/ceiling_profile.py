"""Where one model instance's time goes when forwards take no time: the server's own ceiling.

    python -m bench.ceiling_profile [--concurrency 64] [--seconds 8]

Serves planner_dp over the bench-only emulated engine with a zero table (forwards return at
once, NaN outputs) under perf_analyzer, and meanwhile
- samples the CPU of each process (Triton, the model's stub, perf_analyzer) with psutil;
- records the stub's Python threads with py-spy (installed into the project's venv on first
  use) and sums the samples by function, inclusive;
- reads Triton's own statistics: requests per ``execute`` call;
- measures the ceiling again with requests of 8 and 32 rows, and splits the server's time into
  a cost per request and a cost per row (least squares on time per row = request / rows + row);
then serves the same model over the emulated engine with the A30 table at the same concurrency
and reports how busy one instance keeps that engine (the model's own forward-time metrics),
beside the rows/s the simulator gives the A30 engine alone.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import psutil

from bench.cost_tables import gpu_table, read_lengths
from bench.errors import reports_errors
from bench.harness import add_emulated_variant, build_repository, measure, warm_up
from bench.paths import LENGTHS, ROOT
from bench.sim.run import simulate
from bench.sim.validation import forward_stats, forwards_between
from tools.triton_server import TritonServer

MODEL = "ceiling"
ROWS_PER_REQUEST = (8, 32)  # besides one: how the ceiling moves when clients batch their rows
A30 = "ceiling_a30"  # the same model over the emulated A30 (bench/simulate.py's table:a30)
PROCESSES = {
    "tritonserver": "Triton",
    "triton_python_backend_stub": "model stub",
    "perf_analyzer": "client",
}


def py_spy() -> Path:
    binary = Path(sys.executable).parent / "py-spy"
    if not binary.is_file():
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "py-spy"], check=True)
    return binary


def by_function(raw: Path) -> tuple[Counter[str], Counter[str], int]:
    """(inclusive samples by function, samples by thread, all samples) of py-spy's raw output."""
    inclusive: Counter[str] = Counter()
    threads: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        if not line.strip():
            continue
        stack, count_text = line.rsplit(" ", 1)
        count = int(count_text)
        total += count
        frames = stack.split(";")
        threads[re.sub(r"\s*\(\d+\)", "", frames[0])] += count
        for name in {re.sub(r" \(.*", "", f) for f in frames[1:]}:
            inclusive[name] += count
    return inclusive, threads, total


def per_request_and_per_row(rows_per_s: dict[int, float]) -> tuple[float, float]:
    """(us per request, us per row) fitting us/row = request / rows + row to the ceilings
    measured at each number of rows per request."""
    sizes = sorted(rows_per_s)
    a = np.array([[1.0 / n, 1.0] for n in sizes])
    y = np.array([1e6 / rows_per_s[n] for n in sizes])
    (request_us, row_us), *_ = np.linalg.lstsq(a, y, rcond=None)
    return float(request_us), float(row_us)


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args(argv)
    spy = py_spy()
    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    add_emulated_variant(repository, "planner_dp", MODEL, "zero")
    add_emulated_variant(repository, "planner_dp", A30, "table:a30")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        server = TritonServer.loading_only(repository, (MODEL, A30), tmp / "t.log")
        cpu: dict[str, float] = {}
        raw = tmp / "stub.txt"

        def sample() -> None:
            time.sleep(2)
            tracked = {}
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or [])
                for key, label in PROCESSES.items():
                    # the measured model's own stub, not the other model's beside it
                    ours = label != "model stub" or f"/{MODEL}/1/model.py" in line
                    if key in line.split(" ")[0] and ours:
                        tracked[label] = p
            for p in tracked.values():
                p.cpu_percent(None)
            stub = tracked["model stub"]
            subprocess.run(
                [str(spy), "record", "--pid", str(stub.pid), "-d", str(args.seconds - 3),
                 "-r", "100", "-f", "raw", "-o", str(raw), "--threads"],
                capture_output=True,
            )  # fmt: skip
            for label, p in tracked.items():
                cpu[label] = p.cpu_percent(None)

        with server:
            warm_up(server, tmp, (MODEL,), args.concurrency)
            stats_url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL}/stats"
            before = json.loads(urllib.request.urlopen(stats_url).read())["model_stats"][0]
            thread = threading.Thread(target=sample)
            thread.start()
            row, _ = measure(MODEL, server.grpc_url, args.concurrency, tmp, args.seconds * 1000)
            thread.join()
            after = json.loads(urllib.request.urlopen(stats_url).read())["model_stats"][0]
            by_rows = {1: row.rows_per_s}
            for rows in ROWS_PER_REQUEST:
                clients = max(1, args.concurrency // rows)
                at, _ = measure(
                    MODEL, server.grpc_url, clients, tmp, args.seconds * 1000, rows_per_request=rows
                )
                by_rows[rows] = at.rows_per_s
            warm_up(server, tmp, (A30,), args.concurrency)
            metrics_url = f"http://127.0.0.1:{server.metrics_port}/metrics"
            forwards_before = forward_stats(metrics_url, A30)
            a30_row, _ = measure(A30, server.grpc_url, args.concurrency, tmp, args.seconds * 1000)
            time.sleep(0.6)  # the model publishes its metrics every 0.25 s
            forwards_after = forward_stats(metrics_url, A30)
        inclusive, threads, total = by_function(raw)
    rate = row.rows_per_s
    requests = int(after["inference_count"]) - int(before["inference_count"])
    calls = int(after["execution_count"]) - int(before["execution_count"])
    print(
        f"ceiling: {rate:.0f} rows/s at concurrency {args.concurrency} ({1e6 / rate:.0f} us per row)"
    )
    print(f"requests per execute call: {requests / max(calls, 1):.2f}")
    print("CPU by process (% of one core): " + ", ".join(f"{k} {v:.0f}%" for k, v in cpu.items()))
    print(f"py-spy, the stub's active samples by thread ({total} samples):")
    for name, count in threads.most_common():
        print(f"  {count / total:6.1%}  {name}")

    done = forwards_between(forwards_before, forwards_after).values()
    # busy fraction = forward seconds per row x rows per second
    busy = sum(d["seconds"] for d in done) / max(sum(d["rows"] for d in done), 1.0)
    a30_rate = a30_row.rows_per_s
    alone = simulate(
        read_lengths(LENGTHS), gpu_table("a30"), "dp", concurrency=args.concurrency, seconds=20
    ).rows_per_s
    print(
        f"emulated A30 at concurrency {args.concurrency}: {a30_rate:.0f} rows/s served, the engine "
        f"busy {busy * a30_rate:.0%} of the time; the A30 engine alone "
        f"(simulated, the same planner): {alone:.0f} rows/s, {alone / a30_rate:.0f}x what one "
        "instance feeds it"
    )
    request_us, row_us = per_request_and_per_row(by_rows)
    print(
        "ceiling by rows per request: "
        + ", ".join(f"{n}: {r:.0f} rows/s" for n, r in by_rows.items())
        + f"; the server's time = {request_us:.0f} us per request + {row_us:.0f} us per row"
    )
    print("by function, inclusive:")
    shown = [(n, c) for n, c in inclusive.most_common() if not n.startswith("Thread.")]
    for name, count in shown[:14]:
        print(f"  {count / total:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
