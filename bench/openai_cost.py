"""What the OpenAI API costs: ``/v1/embeddings`` against KServe v2 ``infer``, both through the
same front door, at one concurrency, with one HTTP client of equal cost for both.

    python -m bench.openai_cost [--concurrency 64] [--seconds 8] [--rounds 3]

The client is one asyncio process (aiohttp): C workers in a closed loop, each request one real
text row from bench/data/perf_input.json, each answer read and parsed as JSON (both answers
carry the same 384 floats). The routes alternate round by round, so the shared machine's drift
falls on both alike. ``make bench`` runs it after the serving figures; it writes its section of
docs/PERFORMANCE.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import numpy as np

from bench.docs import publish, render
from bench.errors import reports_errors
from bench.harness import (
    OPENAI_MODEL,
    build_repository,
    loopback_door,
    start_adapter,
    start_body_check,
    warm_up,
)
from bench.paths import INPUT_DATA, ROOT
from tools.front_door import FrontDoor
from tools.triton_server import TritonServer, free_port

BEGIN, END = "<!-- openai:begin -->", "<!-- openai:end -->"
MODEL = OPENAI_MODEL


def kserve_body(text: str) -> bytes:
    return json.dumps(
        {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    ).encode()


def openai_body(text: str) -> bytes:
    return json.dumps({"model": MODEL, "input": text, "encoding_format": "float"}).encode()


@dataclass(frozen=True)
class LoopPoint:
    """What one closed loop of HTTP clients measured: answered rows per second, the latency of
    the answered requests, and how many requests were refused."""

    rows_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int

    def line(self, label: str) -> str:
        return (
            f"{label} {self.rows_per_s:7.1f} rows/s  p50 {self.p50_ms:7.1f}  "
            f"p99 {self.p99_ms:7.1f} ms  errors {self.errors}"
        )


async def closed_loop(
    url: str,
    body: Callable[[str], bytes],
    texts: list[str],
    concurrency: int,
    seconds: float,
    warmup_s: float = 1.0,
) -> LoopPoint:
    """Rows/s and latency percentiles of ``concurrency`` workers sending one row at a time."""
    latencies: list[float] = []
    errors = 0
    started = time.perf_counter()
    measure_from, end = started + warmup_s, started + warmup_s + seconds
    headers = {"Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def worker(k: int) -> None:
            nonlocal errors
            i = k
            while (now := time.perf_counter()) < end:
                payload = body(texts[i % len(texts)])
                i += concurrency
                async with session.post(url, data=payload, headers=headers) as response:
                    answer = await response.read()
                    ok = response.status == 200
                json.loads(answer)
                if now >= measure_from:
                    if ok:
                        latencies.append(time.perf_counter() - now)
                    else:
                        errors += 1

        await asyncio.gather(*(worker(k) for k in range(concurrency)))
    done = np.array(latencies)
    return LoopPoint(
        rows_per_s=len(done) / seconds,
        p50_ms=float(np.percentile(done, 50) * 1e3) if len(done) else float("nan"),
        p99_ms=float(np.percentile(done, 99) * 1e3) if len(done) else float("nan"),
        errors=errors,
    )


def openai_comparison(
    server: TritonServer, tmp: Path, seconds: float, rounds: int, concurrency: int = 64
) -> list[tuple[str, LoopPoint]]:
    """Both routes through one front door, alternating; ``server`` must be running."""
    texts = [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]
    adapter_port = free_port()
    adapter = start_adapter(server, adapter_port, tmp / "openai.log")
    check_ports = (free_port(), free_port())
    check = start_body_check(server, check_ports, tmp / "body_check.log")
    settings = loopback_door(server, adapter_port, check_ports)
    base = f"http://127.0.0.1:{settings.http_port}"
    routes = {
        "KServe /v2 infer": (f"{base}/v2/models/{MODEL}/infer", kserve_body),
        "OpenAI /v1/embeddings": (f"{base}/v1/embeddings", openai_body),
    }
    out = []
    try:
        with FrontDoor(settings, tmp / "front-door-openai"):
            for r in range(rounds):
                order = list(routes) if r % 2 == 0 else list(reversed(routes))
                for name in order:
                    url, body = routes[name]
                    point = asyncio.run(closed_loop(url, body, texts, concurrency, seconds))
                    out.append((name, point))
                    print(point.line(f"c={concurrency} {name:<22}"), flush=True)
    finally:
        adapter.stop()
        check.stop()
    return out


def report(runs: list[tuple[str, LoopPoint]], concurrency: int, seconds: float) -> str:
    names = list(dict.fromkeys(name for name, _ in runs))
    mean = {n: float(np.mean([p.rows_per_s for m, p in runs if m == n])) for n in names}
    table = ["| round | route | rows/s | p50 ms | p99 ms |", "|---:|---|---:|---:|---:|"]
    for i, (name, p) in enumerate(runs):
        table.append(
            f"| {i // 2 + 1} | {name} | {p.rows_per_s:.1f} | {p.p50_ms:.1f} | {p.p99_ms:.1f} |"
        )
    kserve, openai = mean[names[0]], mean[names[1]]
    if names[0].startswith("OpenAI"):
        kserve, openai = openai, kserve
    return render(
        "openai_cost",
        concurrency=concurrency,
        seconds=f"{seconds:g}",
        rounds=len(runs) // 2,
        model=MODEL,
        table="\n".join(table),
        kserve=f"{kserve:.1f}",
        openai=f"{openai:.1f}",
        ratio=f"{openai / kserve:.3f}x",
    )


@reports_errors
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ alone")
    args = parser.parse_args(argv)
    repository, _ = build_repository(args.repository, rebuild=False)
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(
            repository, free_port(), free_port(), free_port(), log_path=Path(tmp) / "triton.log"
        )
        with server:
            warm_up(server, Path(tmp), (MODEL,), args.concurrency)
            runs = openai_comparison(server, Path(tmp), args.seconds, args.rounds, args.concurrency)
    text = report(runs, args.concurrency, args.seconds)
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    sys.exit(main())
