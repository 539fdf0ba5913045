"""Faults of the serving processes, survived: a dead model stub, a wedged body check, a dead
Triton (brought back however often it dies; only a Triton that no longer starts ends the launcher).

The cases share one deployment as `make serve` runs it (tests/e2e/stack.py), over a repository
of one model, in the order written: each leaves it serving, the last ends it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

from testkit.triton_clients import client, infer, text_inputs
from tests.e2e.conftest import _LOGS, repository_of
from tests.e2e.stack import Stack

TOLERANCE = 1e-4
PROBE_INTERVAL_S = "0.5"


def fault_stack(repository, root, models: tuple[str, ...], **env) -> Stack:
    """A deployment of its own over ``models`` alone, probed every half second."""
    stack = Stack(
        repository_of(repository, models, root),
        root / "stack",
        {"PROBE_INTERVAL_S": PROBE_INTERVAL_S, **env},
        models=tuple(m for m in models if not m.endswith("_owner")),
    )
    _LOGS.append(stack.log_path)
    return stack.start()


@pytest.fixture(scope="module")
def stack(repository, tmp_path_factory):
    # RESTART_LIMIT counts starts in a row that never became ready, not deaths
    own = fault_stack(
        repository,
        tmp_path_factory.mktemp("faults"),
        ("minilm",),
        HELPER_PROBE_INTERVAL_S=PROBE_INTERVAL_S,
        RESTART_LIMIT="1",
        LOG_TO_STDOUT="true",
    )
    yield own
    own.stop()


def stubs_of(pid: int) -> list[int]:
    out = subprocess.run(
        ["pgrep", "-P", str(pid), "-f", "triton_python_backend_stub"],
        capture_output=True,
        text=True,
    )
    return [int(p) for p in out.stdout.split()]


def processes_mentioning(text: str) -> list[str]:
    out = subprocess.run(
        ["ps", "-eww", "-o", "pid,stat,args"], capture_output=True, text=True
    ).stdout
    return [line for line in out.splitlines()[1:] if text in line and " Z" not in line]


def test_a_killed_model_stub_fails_in_flight_requests_and_the_model_comes_back(
    stack, tokenizer, reference_model
):
    text = "back after a stub died"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    embedding, _ = infer(client(stack, "http"), "minilm", text_inputs("http", [text]))
    assert np.abs(embedding - expected).max() <= TOLERANCE
    outcomes: list[object] = []

    def in_flight() -> None:
        started = time.monotonic()
        try:
            infer(client(stack, "grpc"), "minilm", text_inputs("grpc", ["a long row " * 50] * 64))
            outcomes.append(("answered", time.monotonic() - started))
        except Exception as err:
            outcomes.append((err, time.monotonic() - started))

    threads = [threading.Thread(target=in_flight) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    triton = stack.triton_pid()
    stubs = stubs_of(triton)
    assert stubs, "the model stubs are children of tritonserver"
    killed_at = time.monotonic()
    for stub in stubs:
        os.kill(stub, signal.SIGKILL)
    saw_not_ready = False
    while time.monotonic() - killed_at < 60:
        saw_not_ready |= not stack.ready()
        try:
            embedding, _ = infer(client(stack, "http"), "minilm", text_inputs("http", [text]))
            if np.abs(embedding - expected).max() <= TOLERANCE:
                break
        except Exception:
            pass
        time.sleep(0.1)
    back_after = time.monotonic() - killed_at
    for t in threads:
        t.join(30)
    assert back_after < 30, f"the model was not back after {back_after:.0f} s"
    assert saw_not_ready, "readiness turned false while the model could not serve"
    assert len(outcomes) == 3, "no in-flight request hangs"
    for outcome, seconds in outcomes:
        # answered before the kill, or ended with an error well before the backstop timeout
        assert outcome == "answered" or "unavailable" in str(outcome).lower(), outcome
        assert seconds < 20, seconds
    assert "restarting Triton" in stack.output() and stack.triton_pid() != triton
    # LOG_TO_STDOUT: Triton's own log lines, the dead stub's included, on the launcher's output
    echoed = [line for line in stack.output().splitlines() if line.startswith("[triton] ")]
    assert any("minilm" in line for line in echoed), echoed[-5:]


def wait_until_answered(stack, text: str, expected, timeout_s: float = 60.0) -> float:
    """Seconds until the model answers ``text`` right again (the timeout: it never did)."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        with contextlib.suppress(Exception):
            embedding, _ = infer(client(stack, "http"), "minilm", text_inputs("http", [text]))
            if np.abs(embedding - expected).max() <= TOLERANCE:
                break
        time.sleep(0.2)
    return time.monotonic() - started


def test_a_wedged_body_check_is_restarted_like_a_dead_one(stack, tokenizer, reference_model):
    text = "checked again after the check was wedged"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    (check,) = subprocess.run(
        ["pgrep", "-f", f"body_check.*--http-listen=127.0.0.1:{stack.ports['CHECK_HTTP']}"],
        capture_output=True,
        text=True,
    ).stdout.split()
    try:
        os.kill(int(check), signal.SIGSTOP)  # alive, answering nothing
        back_after = wait_until_answered(stack, text, expected)
        assert back_after < 30, f"KServe inference was not back after {back_after:.0f} s"
        assert "body_check failed (3 health probes missed in a row)" in stack.output()
        samples = stack.metrics_samples(
            "serve_restarts_total", part="body_check", cause="unresponsive"
        )
        assert [s.value for s in samples] == [1.0]
        assert stack.process.poll() is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(check), signal.SIGKILL)


def test_a_killed_triton_is_always_brought_back_and_only_failed_starts_end_the_launcher(
    stack, tokenizer, reference_model
):
    # RESTART_LIMIT is 1: Triton killed (and restarted once before, for its dead stub) comes
    # back each time, twice in a row past the limit; then a Triton that cannot start ends it
    text = "back after Triton died"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    killed = []
    try:
        load = threading.Thread(
            target=lambda: [
                _ignore_errors(
                    lambda: infer(
                        client(stack, "http"), "minilm", text_inputs("http", ["load"] * 16)
                    )
                )
                for _ in range(20)
            ]
        )
        load.start()
        time.sleep(0.5)
        pid = stack.triton_pid()
        killed.append(pid)
        os.kill(pid, signal.SIGKILL)
        back_after = wait_until_answered(stack, text, expected)
        assert back_after < 45, f"the model was not back after {back_after:.0f} s"
        assert stack.process.poll() is None, "the launcher keeps serving"
        settle = time.monotonic() + 30  # the launcher has seen it ready
        while stack.output().count("Triton is back after") < 2:  # the dead stub's restart too
            assert time.monotonic() < settle
            time.sleep(0.1)
        load.join(60)
        assert "triton failed (it exited); restarting it in" in stack.output()
        restarts = stack.metrics_samples("serve_restarts_total", part="triton", cause="exited")
        assert [s.value for s in restarts] == [1.0]
        # its HTTP port taken while it is down: its next start fails, and that ends the launcher
        pid = stack.triton_pid()
        killed.append(pid)
        with socket.socket() as taken:
            taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            os.kill(pid, signal.SIGKILL)
            bind_when_free(taken, stack.ports["TRITON_HTTP"])
            code = stack.process.wait(timeout=90)
    finally:
        stack.stop()
    assert code == 1
    assert "triton did not start: giving up, stopping everything" in stack.output()
    state = str(stack.state_dir)
    assert not processes_mentioning(state), processes_mentioning(state)  # nginx, Triton, stubs
    for pid in killed:
        assert not processes_mentioning(f" {pid} "), "no stub of a dead server is left"


def bind_when_free(sock: socket.socket, port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
            return
        except OSError:
            assert time.monotonic() < deadline, f"port {port} still taken"
            time.sleep(0.01)


def _ignore_errors(call) -> None:
    with contextlib.suppress(Exception):  # the load only has to be in flight
        call()
