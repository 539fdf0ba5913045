"""Where one model instance's time goes when forwards take no time: the server's own ceiling.

    python -m bench.ceiling_profile [--concurrency 64] [--seconds 8]

Serves planner_dp over the bench-only emulated engine with a zero table (forwards return at
once, NaN outputs) under perf_analyzer, and meanwhile
- samples the CPU of each process (Triton, the model's stub, perf_analyzer) with psutil;
- records the stub's Python threads with py-spy (installed into the project's venv on first
  use) and sums the samples by function, inclusive;
- reads Triton's own statistics: requests per ``execute`` call.
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

import psutil

from bench.emulated_engine import EMULATED_MODEL_PY, TABLE_FILE
from bench.serving import ROOT, build_repository, measure, warm_up
from builder.triton_config import add_model_variant
from tools.triton_server import TritonServer, free_port

MODEL = "ceiling"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=8)
    args = parser.parse_args(argv)
    spy = py_spy()
    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    add_model_variant(repository, "planner_dp", MODEL, model_py=EMULATED_MODEL_PY)
    (repository / MODEL / "1" / TABLE_FILE).write_text("zero\n")
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        server = TritonServer(
            repository,
            free_port(),
            free_port(),
            free_port(),
            log_path=tmp / "t.log",
            extra_args=[f"--load-model={MODEL}", "--model-control-mode=explicit"],
        )
        cpu: dict[str, float] = {}
        raw = tmp / "stub.txt"

        def sample() -> None:
            time.sleep(2)
            tracked = {}
            for p in psutil.process_iter(["cmdline"]):
                line = " ".join(p.info["cmdline"] or [])
                for key, label in PROCESSES.items():
                    if key in line.split(" ")[0]:
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
        inclusive, threads, total = by_function(raw)
    rate = row["Inferences/Second"]
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
    print("by function, inclusive:")
    shown = [(n, c) for n, c in inclusive.most_common() if not n.startswith("Thread.")]
    for name, count in shown[:14]:
        print(f"  {count / total:6.1%}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
