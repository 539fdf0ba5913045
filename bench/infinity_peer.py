"""A served peer a user would pick instead: Infinity (infinity-emb), side by side with this
project and Triton's dynamic batcher, with one HTTP client of equal cost for all three.

    python -m bench.infinity_peer [--concurrency 8,32,64] [--seconds 8]

Infinity runs in a virtual environment of its own under build/ (``infinity-emb[server,torch]``
0.0.78 beside torch 2.13.0 for the CPU; its ONNX engine does not install with current packages),
serving the same MiniLM from the same local directory with its torch engine on the CPU, batch
size 64, and its OpenAI-style ``POST /embeddings``. This project answers ``/v1/embeddings``
(the OpenAI adapter) and the dynamic-batching peer KServe ``infer``, both through the front door.
The client (bench/openai_cost.py's closed loop: aiohttp, one real text row per request, every
answer parsed as JSON) is the same for all; the three take turns at each concurrency, the order
flipping every round, so the shared machine's drift falls on all alike. Only one server works at
a time; the others wait idle.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.docs import publish, render
from bench.errors import reports_errors
from bench.harness import OPENAI_MODEL as MODEL
from bench.harness import (
    PEER,
    build_repository,
    loopback_door,
    start_adapter,
    start_body_check,
    warm_up,
)
from bench.openai_cost import LoopPoint, closed_loop, kserve_body, openai_body
from bench.paths import INPUT_DATA, ROOT
from tools.front_door import FrontDoor
from tools.triton_server import TritonServer, answers_ok, free_port

BEGIN, END = "<!-- infinity:begin -->", "<!-- infinity:end -->"
INFINITY_VENV = ROOT / "build" / "infinity-venv"
INFINITY_PACKAGES = ["infinity-emb[server,torch]==0.0.78", "torch==2.13.0"]


def ensure_infinity(venv: Path = INFINITY_VENV) -> Path:
    """Infinity's command, installed into its own virtual environment on first use."""
    binary = venv / "bin" / "infinity_emb"
    if not binary.is_file():
        print(f"installing {' '.join(INFINITY_PACKAGES)} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "--quiet", *INFINITY_PACKAGES], check=True
        )
    return binary


def start_infinity(binary: Path, model_dir: Path, port: int, log: Path) -> subprocess.Popen:
    command = [str(binary), "v2", "--model-id", str(model_dir), "--served-model-name", "minilm"]
    command += ["--engine", "torch", "--device", "cpu", "--batch-size", "64"]
    command += ["--port", str(port), "--host", "127.0.0.1"]
    process = subprocess.Popen(
        command,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"},
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 180
    while not answers_ok(f"http://127.0.0.1:{port}/health"):
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"Infinity did not start: {log.read_text()[-1500:]}")
        time.sleep(0.5)
    return process


def infinity_body(text: str) -> bytes:
    return json.dumps({"model": "minilm", "input": [text]}).encode()


def run(levels: list[int], seconds: float, rounds: int) -> list[tuple[int, str, LoopPoint]]:
    from builder.build import default_model_dir

    binary = ensure_infinity()
    repository, _ = build_repository(ROOT / "build" / "bench-repository", rebuild=False)
    texts = [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]
    out = []
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        server = TritonServer(
            repository, free_port(), free_port(), free_port(), log_path=tmp / "triton.log"
        )
        infinity_port = free_port()
        with server:
            warm_up(server, tmp, (MODEL, PEER))
            adapter_port = free_port()
            adapter = start_adapter(server, adapter_port, tmp / "openai.log")
            model_dir = default_model_dir()
            assert model_dir is not None, "the MiniLM package is missing: run make setup"
            infinity = start_infinity(binary, model_dir, infinity_port, tmp / "inf.log")
            check_ports = (free_port(), free_port())
            check = start_body_check(server, check_ports, tmp / "body_check.log")
            settings = loopback_door(server, adapter_port, check_ports)
            door = f"http://127.0.0.1:{settings.http_port}"
            routes = {
                "this project, /v1/embeddings": (f"{door}/v1/embeddings", openai_body),
                "Triton dynamic batcher, infer": (f"{door}/v2/models/{PEER}/infer", kserve_body),
                "Infinity 0.0.78, /embeddings": (
                    f"http://127.0.0.1:{infinity_port}/embeddings",
                    infinity_body,
                ),
            }
            try:
                with FrontDoor(settings, tmp / "front-door"):
                    for url, body in routes.values():  # each warmed once
                        asyncio.run(closed_loop(url, body, texts, 8, 2.0, warmup_s=0.5))
                    for c in levels:
                        for r in range(rounds):
                            names = list(routes) if r % 2 == 0 else list(reversed(routes))
                            for name in names:
                                url, body = routes[name]
                                point = asyncio.run(closed_loop(url, body, texts, c, seconds))
                                out.append((c, name, point))
                                print(point.line(f"c={c:>3} {name:<32}"), flush=True)
            finally:
                adapter.stop()
                check.stop()
                infinity.terminate()
                infinity.wait(timeout=20)
    return out


def report(runs: list[tuple[int, str, LoopPoint]], seconds: float, rounds: int) -> str:
    levels = sorted({c for c, _, _ in runs})
    names = list(dict.fromkeys(n for _, n, _ in runs))

    def mean(c: int, name: str, field: str) -> float:
        return float(np.mean([getattr(p, field) for cc, n, p in runs if cc == c and n == name]))

    table = [
        "| concurrency | " + " | ".join(f"{n}: rows/s, p50, p99 ms" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for c in levels:
        cells = [
            f"{mean(c, n, 'rows_per_s'):.1f}, {mean(c, n, 'p50_ms'):.0f}, {mean(c, n, 'p99_ms'):.0f}"
            for n in names
        ]
        table.append(f"| {c} | " + " | ".join(cells) + " |")
    ours, infinity = names[0], names[-1]
    ratios = [
        f"{mean(c, ours, 'rows_per_s') / mean(c, infinity, 'rows_per_s'):.2f}x at {c}"
        for c in levels
    ]
    return render(
        "infinity_peer",
        levels=",".join(map(str, levels)),
        seconds=f"{seconds:g}",
        rounds=rounds,
        table="\n".join(table),
        ratios=", ".join(ratios),
    )


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="8,32,64")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = run(levels, args.seconds, args.rounds)
    text = report(runs, args.seconds, args.rounds)
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    sys.exit(main())
