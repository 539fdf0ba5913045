"""The body check's own CPU per request, by kind of body.

    python -m bench.body_check_cost [--requests 300] [--rounds 3] [--no-write]

The body check (body_check) runs in front of a real Triton serving the bench model; one client
sends each kind of body straight to the check's ports, one request at a time, and the check
process's CPU (user plus system, psutil) is read before and after: its whole cost, the proxying
included. The rules alone (``body_check.rules``, in this process) are timed on the same bodies,
so the table splits what checking costs from what passing a body on costs. The 8 MB bodies pass
the check (their sizes agree) and are then refused by the model (a shape it does not take):
the check's cost is that of a body at the front door's limit.
"""

from __future__ import annotations

import argparse
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from bench.docs import publish, render
from bench.errors import reports_errors
from bench.harness import build_repository, start_body_check
from bench.paths import ROOT
from body_check.proxy import read_infer_request
from body_check.rules import BodyLimits, check_json_request
from tools.triton_server import TritonServer, free_port

MODEL = "planner_dp"
BEGIN, END = "<!-- body-check:begin -->", "<!-- body-check:end -->"
EIGHT_MB = 8 << 20


@dataclass(frozen=True)
class Body:
    """One kind of body: how it is sent, and the rules' check of it in this process."""

    name: str
    send: Callable[[], object]
    check: Callable[[], object]
    repeat: float  # a share of --requests: large bodies are sent fewer times


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def one_row_http(port: int, binary: bool) -> tuple[Callable[[], object], Callable[[], object]]:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = httpclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a one-row request"]], dtype=object), binary_data=binary)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    limits = BodyLimits()
    return (
        lambda: client.infer(MODEL, [tensor]),
        lambda: check_json_request(body, header_length, limits).body(),
    )


def one_row_grpc(port: int) -> tuple[Callable[[], object], Callable[[], object]]:
    from tritonclient.grpc import service_pb2

    client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
    tensor = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"a one-row request"]], dtype=object))
    request = service_pb2.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    request.raw_input_contents.append(b"\x11\0\0\0a one-row request")
    message = request.SerializeToString()
    limits = BodyLimits()
    return lambda: client.infer(MODEL, [tensor]), lambda: read_infer_request(message, limits)


def post_raw(port: int, body: bytes, headers: dict[str, str]) -> None:
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as answer:
            answer.read()
    except urllib.error.HTTPError as err:
        if err.code == 400 and b"body" in err.read()[:200]:
            raise AssertionError("the body check refused a bench body") from None


def eight_mb_json() -> bytes:
    """INT64 token ids, as JSON, as close under 8 MB as whole rows of 8 digits allow."""
    count = (EIGHT_MB - 200) // 9
    ids = ",".join(["12345678"] * count)
    head = f'{{"inputs":[{{"name":"INPUT_IDS","datatype":"INT64","shape":[1,{count}],"data":['
    return (head + ids + "]}]}").encode()


def eight_mb_binary() -> tuple[bytes, dict[str, str]]:
    """2048 BYTES rows of 4 kB in the binary-tensor extension: 2048 length prefixes to walk."""
    rows = np.array([[b"x" * 4092] for _ in range(2048)], dtype=object)
    tensor = httpclient.InferInput("TEXT", list(rows.shape), "BYTES")
    tensor.set_data_from_numpy(rows, binary_data=True)
    body, header_length = httpclient.InferenceServerClient.generate_request_body([tensor])
    return body, {"Inference-Header-Content-Length": str(header_length)}


def bodies(http_port: int, grpc_port: int) -> list[Body]:
    limits = BodyLimits()
    json_body = eight_mb_json()
    binary_body, binary_headers = eight_mb_binary()
    header_length = int(binary_headers["Inference-Header-Content-Length"])
    return [
        Body(
            "1 row, HTTP, binary tensors (tritonclient's default)",
            *one_row_http(http_port, True),
            1.0,
        ),
        Body("1 row, HTTP, JSON", *one_row_http(http_port, False), 1.0),
        Body("1 row, gRPC", *one_row_grpc(grpc_port), 1.0),
        Body(
            f"{len(json_body) / 2**20:.1f} MB JSON, {json_body.count(b',') + 1} INT64 ids",
            lambda: post_raw(http_port, json_body, {"Content-Type": "application/json"}),
            lambda: check_json_request(json_body, None, limits).body(),
            0.02,
        ),
        Body(
            f"{len(binary_body) / 2**20:.1f} MB binary, 2048 BYTES rows",
            lambda: post_raw(http_port, binary_body, binary_headers),
            lambda: check_json_request(binary_body, header_length, limits).body(),
            0.05,
        ),
    ]


def measure(body: Body, check: psutil.Process, requests: int) -> tuple[float, float]:
    """(the check process's CPU us per request, the rules' CPU us per request)."""
    count = max(3, int(requests * body.repeat))
    body.send()  # warm: connections open, first-use allocations made
    before = cpu_seconds(check)
    for _ in range(count):
        body.send()
    process_us = (cpu_seconds(check) - before) / count * 1e6
    started = time.process_time()
    for _ in range(count):
        body.check()
    rules_us = (time.process_time() - started) / count * 1e6
    return process_us, rules_us


@reports_errors
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300, help="one-row requests per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repo")
    parser.add_argument("--no-write", action="store_true", help="print, do not write docs/")
    args = parser.parse_args()
    repository, _ = build_repository(args.repository, rebuild=False)
    results: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        server = TritonServer(
            repository, free_port(), free_port(), free_port(), log_path=Path(tmp) / "triton.log"
        )
        with server:
            ports = (free_port(), free_port())
            helper = start_body_check(server, ports, Path(tmp) / "body_check.log")
            try:
                assert helper.process is not None
                check = psutil.Process(helper.process.pid)
                kinds = bodies(*ports)
                for r in range(args.rounds):
                    for body in kinds if r % 2 == 0 else kinds[::-1]:
                        point = measure(body, check, args.requests)
                        results.setdefault(body.name, []).append(point)
                        print(
                            f"round {r + 1} {body.name:<55} {point[0]:8.0f} us  rules {point[1]:8.0f} us",
                            flush=True,
                        )
            finally:
                helper.stop()
    table = [
        "| body | the check's process, CPU us per request | the rules alone | passing it on |",
        "|---|---|---|---|",
    ]
    for name, points in results.items():
        process_us = float(np.mean([p for p, _ in points]))
        rules_us = float(np.mean([r for _, r in points]))
        table.append(
            f"| {name} | {process_us:,.0f} | {rules_us:,.0f} | {process_us - rules_us:,.0f} |"
        )
    text = render(
        "body_check_cost",
        requests=args.requests,
        rounds=args.rounds,
        table="\n".join(table),
        measured=time.strftime("%Y-%m-%d"),
    )
    return publish(text, BEGIN, END, write=not args.no_write)


if __name__ == "__main__":
    raise SystemExit(main())
