"""Runs the perf_analyzer binary that tools/install_perf_analyzer.sh puts in build/perf."""

from __future__ import annotations

import csv
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BINARY = ROOT / "build" / "perf" / "perf_analyzer"


def perf_analyzer_env() -> dict[str, str]:
    """libcudart from the nvidia-cuda-runtime-cu12 wheel on the library path (no GPU needed)."""
    import nvidia.cuda_runtime

    lib = os.path.join(next(iter(nvidia.cuda_runtime.__path__)), "lib")
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = ":".join(filter(None, [lib, env.get("LD_LIBRARY_PATH", "")]))
    return env


@dataclass(frozen=True)
class PerfPoint:
    """One perf_analyzer measurement, as the benchmarks read it: rates in rows (perf_analyzer's
    Inferences/Second counts a request's batch of rows), latencies per request."""

    rows_per_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float

    @classmethod
    def from_csv_row(cls, row: dict[str, str]) -> PerfPoint:
        def number(key: str) -> float:
            return float(row[key])

        return cls(
            rows_per_s=number("Inferences/Second"),
            p50_ms=number("p50 latency") / 1e3,  # the CSV's latencies are microseconds
            p90_ms=number("p90 latency") / 1e3,
            p99_ms=number("p99 latency") / 1e3,
        )


def run_perf_analyzer(
    model: str,
    grpc_url: str,
    input_data: Path,
    concurrency: int,
    csv_path: Path,
    measurement_ms: int = 4000,
    max_trials: int = 4,
    stability_percent: float = 50,
    timeout_s: float = 300,
    request_rate: float | None = None,
    rows_per_request: int = 1,
) -> tuple[PerfPoint, str]:
    """One point: ``concurrency`` requests in flight, or an offered ``request_rate`` per second;
    each request of ``rows_per_request`` rows (perf_analyzer's batch size: its Inferences/Second
    counts rows).

    Returns (the point, perf_analyzer's output)."""
    if not BINARY.is_file():
        raise FileNotFoundError(f"{BINARY} is missing: run `make setup`")
    command = [
        str(BINARY),
        "-m",
        model,
        "-u",
        grpc_url,
        "-i",
        "grpc",
        f"--input-data={input_data}",
        "--shape=TEXT:1",
        f"-b{rows_per_request}",
        *(
            [f"--concurrency-range={concurrency}:{concurrency}"]
            if request_rate is None
            else [f"--request-rate-range={request_rate:.2f}:{request_rate:.2f}", "--max-threads=64"]
        ),
        f"--measurement-interval={measurement_ms}",
        f"--max-trials={max_trials}",
        f"--stability-percentage={stability_percent}",
        "-f",
        str(csv_path),
    ]
    done = subprocess.run(
        command, env=perf_analyzer_env(), capture_output=True, text=True, timeout=timeout_s
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed ({done.returncode}):\n{output[-3000:]}")
    with open(csv_path) as f:
        row = next(csv.DictReader(f))
    return PerfPoint.from_csv_row(row), output
