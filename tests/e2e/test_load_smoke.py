"""A few seconds of perf_analyzer against the real server: no errors under load."""

from __future__ import annotations

from pathlib import Path

from tools.perf_analyzer import run_perf_analyzer

ROOT = Path(__file__).resolve().parents[2]


def test_perf_analyzer_at_concurrency_4_sees_no_errors(server, tmp_path):
    row, output = run_perf_analyzer(
        "minilm",
        server.grpc_url,
        ROOT / "bench" / "data" / "perf_input.json",
        concurrency=4,
        csv_path=tmp_path / "smoke.csv",
        measurement_ms=2000,
        max_trials=3,
        stability_percent=1000,  # a smoke test: any stable-enough window will do
    )
    assert row.rows_per_s > 0
    assert "error" not in output.lower(), output[-2000:]
