"""The body check's processes in front of the real Triton: with several workers on the same
ports both protocols are served, and a worker that dies takes the command down with it (exit 1,
nothing left on the ports), so whatever runs it starts it again; a gRPC call whose message never
comes ends at the body deadline while other calls are served."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

from testkit.triton_clients import PROTOCOLS, infer, text_inputs
from tools.triton_server import ROOT, answers_ok, free_port

WORKERS = 2


def start_check(server, tmp_path, *options: str):
    ports = {"http": free_port(), "grpc": free_port(), "stream": free_port()}
    command = [
        sys.executable,
        "-m",
        "body_check",
        f"--triton-http=127.0.0.1:{server.http_port}",
        f"--triton-grpc=127.0.0.1:{server.grpc_port}",
        f"--http-listen=127.0.0.1:{ports['http']}",
        f"--grpc-listen=127.0.0.1:{ports['grpc']}",
        f"--stream-listen=127.0.0.1:{ports['stream']}",
        *options,
    ]
    log = (tmp_path / "body_check.log").open("wb")
    process = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 30
    while not answers_ok(f"http://127.0.0.1:{ports['http']}/health"):
        assert process.poll() is None and time.monotonic() < deadline, "did not start"
        time.sleep(0.1)
    return process, ports


def stop_check(process) -> None:
    if process.poll() is None:
        process.terminate()
        process.wait(timeout=15)


@pytest.fixture
def checked(server, tmp_path):
    process, ports = start_check(server, tmp_path, f"--workers={WORKERS}")
    yield process, ports
    stop_check(process)


class At:
    """What testkit's client() takes: the check's own URLs."""

    def __init__(self, ports: dict[str, int]) -> None:
        self.http_url = f"127.0.0.1:{ports['http']}"
        self.grpc_url = f"127.0.0.1:{ports['grpc']}"


def test_workers_serve_both_protocols_and_one_dying_ends_the_command(
    checked, tokenizer, reference_model
):
    from testkit.triton_clients import client

    process, ports = checked
    # the spawned workers (multiprocessing also starts a resource tracker beside them)
    workers = [
        child
        for child in psutil.Process(process.pid).children()
        if "spawn_main" in " ".join(child.cmdline())
    ]
    assert len(workers) == WORKERS
    text = "checked by one of two workers"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    for protocol in PROTOCOLS:
        for _ in range(4):  # new connections: the kernel may pick either worker
            embedding, _ = infer(
                client(At(ports), protocol), "minilm", text_inputs(protocol, [text])
            )
            assert np.abs(embedding - expected).max() <= 1e-4, protocol
    os.kill(workers[0].pid, signal.SIGKILL)
    assert process.wait(timeout=20) == 1
    assert not any(w.is_running() and w.status() != psutil.STATUS_ZOMBIE for w in workers)
    assert not answers_ok(f"http://127.0.0.1:{ports['http']}/health")


def test_a_grpc_message_that_never_comes_ends_at_the_body_deadline_and_others_are_served(
    server, tmp_path, tokenizer, reference_model
):
    """Real gRPC core in front of the check's ModelInfer handler: a call that sends its headers
    and never its message holds one read until the body deadline, then ends DEADLINE_EXCEEDED;
    meanwhile and afterwards every other call is answered right."""
    import threading

    import grpc

    from testkit.triton_clients import client

    process, ports = start_check(server, tmp_path, "--body-deadline-s=1")
    released = threading.Event()

    def never():
        released.wait(30)  # gRPC's sending thread waits here: the message never comes
        yield b""

    channel = grpc.insecure_channel(f"127.0.0.1:{ports['grpc']}")
    try:
        infer_call = channel.stream_unary("/inference.GRPCInferenceService/ModelInfer")
        started = time.monotonic()
        parked = infer_call.future(never(), timeout=30)
        text = "served beside a parked call"
        expected = reference_model(tokenizer.encode([text], truncate=True))
        embedding, _ = infer(client(At(ports), "grpc"), "minilm", text_inputs("grpc", [text]))
        assert np.abs(embedding - expected).max() <= 1e-4
        with pytest.raises(grpc.RpcError) as ended:
            parked.result(timeout=20)
        assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "did not arrive whole within 1 s" in ended.value.details()
        assert time.monotonic() - started < 10
        embedding, _ = infer(client(At(ports), "grpc"), "minilm", text_inputs("grpc", [text]))
        assert np.abs(embedding - expected).max() <= 1e-4
    finally:
        released.set()
        channel.close()
        stop_check(process)
