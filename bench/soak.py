"""Soak: many concurrent clients mixing valid, invalid, cancelled and timed-out requests, half of
the clients in service class 2 (every other one).

    python -m bench.soak [--seconds 120] [--clients 64] [--repository DIR]

Bounded in time and count; talks only to a server it starts on loopback. Every valid request
must be answered once with its own rows' outputs (checked against MiniLM in torch, each row
alone); invalid ones must get INVALID_ARGUMENT; cancelled and timed-out ones may get an error or
(if they won the race) a correct answer, never a wrong one. The server's and the Python stubs'
resident memory is sampled after warm-up and at the end, and the growth reported.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.errors import BenchError, reports_errors
from builder.corpus import corpus_rows
from python_backend.common.contract import CLASS_PARAMETER
from testkit.triton_clients import client, infer, text_inputs

TOLERANCE = 1e-4
STRICT = {"truncate": False}  # the invalid requests' parameters
INVALID = [
    lambda p: text_inputs(p, [""]),
    lambda p: text_inputs(p, [b"\xff\xfe"]),
    lambda p: text_inputs(p, ["a long paragraph " * 200]),  # over the limit, truncate off
]


@dataclass
class SoakResult:
    counts: Counter = field(default_factory=Counter)  # outcome -> requests
    wrong: list[str] = field(default_factory=list)  # any valid request that was not right
    memory_mb: dict[str, tuple[float, float]] = field(
        default_factory=dict
    )  # process -> (start, end)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.wrong


def process_memory_mb(server_pid: int) -> dict[str, float]:
    import psutil

    server = psutil.Process(server_pid)
    out = {"tritonserver": server.memory_info().rss / 2**20}
    for child in server.children(recursive=True):
        if "triton_python_backend_stub" in " ".join(child.cmdline()):
            name = next(
                (a.split("/")[-3] for a in child.cmdline() if a.endswith("/model.py")), "stub"
            )
            out[f"stub {name}"] = child.memory_info().rss / 2**20
    return out


def run_soak(
    server,
    reference: dict[int, np.ndarray],
    texts: list[str],
    seconds: float,
    clients: int,
    model: str = "minilm",
    seed: int = 0,
) -> SoakResult:
    """Drives ``server`` for ``seconds`` with ``clients`` threads; returns what happened."""
    result = SoakResult()
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def record(outcome: str, problem: str | None = None) -> None:
        with lock:
            result.counts[outcome] += 1
            if problem:
                result.wrong.append(problem)

    def check(rows: list[int], embedding: np.ndarray) -> str | None:
        want = np.stack([reference[r] for r in rows])
        diff = float(np.abs(embedding - want).max())
        return None if diff <= TOLERANCE else f"rows {rows}: max diff {diff:.2e}"

    def worker(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        http, grpc = client(server, "http"), client(server, "grpc")
        in_class = {CLASS_PARAMETER: 2} if k % 2 else {}  # as the check writes `priority`
        # Each worker's first request is spread over the mix, so that however slow the machine,
        # the first round alone sends every kind in proportion; then the mix is drawn.
        first = True
        while first or time.monotonic() < stop_at:
            kind = (k + 0.5) / clients if first else rng.random()
            first = False
            protocol = rng.choice(("http", "grpc"))
            c = http if protocol == "http" else grpc
            rows = [rng.randrange(len(texts)) for _ in range(rng.randint(1, 4))]
            inputs = text_inputs(protocol, [texts[r] for r in rows])
            try:
                if kind < 0.70:
                    embedding, _ = infer(c, model, inputs, in_class or None)
                    problem = check(rows, embedding)
                    record("valid: right answer" if problem is None else "valid: WRONG", problem)
                elif kind < 0.85:
                    try:
                        infer(c, model, rng.choice(INVALID)(protocol), {**in_class, **STRICT})
                        record("invalid: answered", "an invalid request was answered")
                    except Exception as err:
                        status = str(err.status()) if hasattr(err, "status") else ""
                        good = status in ("400", "StatusCode.INVALID_ARGUMENT")
                        record(
                            "invalid: refused" if good else "invalid: other error",
                            None if good else f"invalid request got {err}",
                        )
                elif kind < 0.925:
                    future = grpc.async_infer(
                        model,
                        text_inputs("grpc", [texts[r] for r in rows]),
                        callback=lambda *_, **__: None,  # called as (result=, error=)
                        parameters=in_class or None,
                    )
                    time.sleep(rng.random() * 0.02)
                    future.cancel()
                    record("cancelled")
                else:
                    try:
                        embedding, _ = infer(c, model, inputs, {"timeout_ms": 1, **in_class})
                        problem = check(rows, embedding)
                        record(
                            "timeout: answered in time" if problem is None else "timeout: WRONG",
                            problem,
                        )
                    except Exception as err:
                        msg = str(err)
                        record(
                            "timeout: deadline error"
                            if "deadline" in msg
                            else "timeout: other error",
                            None if "deadline" in msg else f"timed request got {msg}",
                        )
            except Exception as err:
                record("valid: ERROR", f"valid request failed: {err}")
        http.close()
        grpc.close()

    memory_start = process_memory_mb(server.process.pid)
    started = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 120)
    result.seconds = time.monotonic() - started
    memory_end = process_memory_mb(server.process.pid)
    result.memory_mb = {k: (memory_start[k], memory_end.get(k, float("nan"))) for k in memory_start}
    return result


def reference_embeddings(texts: list[str]) -> dict[int, np.ndarray]:
    from builder.build import default_model_dir
    from builder.families import load_model, run_rows_served
    from python_backend.common.tokenization import TextTokenizer

    model_dir = default_model_dir()
    if model_dir is None:
        raise BenchError("the reference model is not installed: run `make setup`")
    rows = TextTokenizer(model_dir / "tokenizer.json", 256).encode(texts, truncate=True)
    return dict(enumerate(run_rows_served(load_model(model_dir), rows)))


def report(result: SoakResult, clients: int) -> str:
    lines = [
        f"{clients} clients, {result.seconds:.0f} s, {sum(result.counts.values())} requests",
        "",
        "| outcome | requests |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(result.counts.items())]
    lines += [
        "",
        "| process | RSS after warm-up (MB) | RSS at the end (MB) | growth |",
        "|---|---|---|---|",
    ]
    for name, (a, b) in sorted(result.memory_mb.items()):
        lines.append(f"| {name} | {a:.0f} | {b:.0f} | {b - a:+.0f} MB ({(b - a) / a:+.1%}) |")
    lines.append("")
    lines.append("wrong or lost: none" if result.ok else "WRONG: " + "; ".join(result.wrong[:10]))
    return "\n".join(lines)


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument(
        "--repository",
        type=Path,
        default=None,
        help="model repository holding minilm (default: build one in a temp dir)",
    )
    args = parser.parse_args()
    if not 1 <= args.clients <= 256 or not 1 <= args.seconds <= 900:
        parser.error("--clients must be 1..256 and --seconds 1..900 (the soak is bounded)")
    from builder.build import build
    from builder.spec import BuildSpec
    from tools.triton_server import TritonServer, free_port

    with tempfile.TemporaryDirectory() as tmp:
        repository = args.repository
        if repository is None:
            repository = Path(tmp) / "repository"
            build(
                BuildSpec(
                    repository=repository,
                    quiet=True,
                    calibration_repeats=0,
                    buckets=(16, 32, 64, 128, 256),
                )
            )
        texts = corpus_rows(300, seed=99)
        reference = reference_embeddings(texts)
        server = TritonServer(
            repository, free_port(), free_port(), free_port(), log_path=Path(tmp) / "triton.log"
        )
        with server:
            run_soak(server, reference, texts, seconds=15, clients=args.clients)  # warm-up
            result = run_soak(server, reference, texts, args.seconds, args.clients)
        print(report(result, args.clients))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
