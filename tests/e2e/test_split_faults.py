"""The split layout's failures, survived, in the deployment as `make serve` runs it: a killed
queue owner (reloaded alone), a killed front (Triton restarted), a front stopped for 10 s.

The cases share one deployment, in the order written; each leaves it serving."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

import numpy as np
import pytest

from testkit.triton_clients import client, infer, text_inputs
from tests.e2e.test_faults_survived import TOLERANCE, fault_stack
from tools.serve import child_stubs, stub_model

MODEL = "minilm_split"
LONG = ["a long row " * 50] * 32  # a request that keeps the owner busy for a while


@pytest.fixture(scope="module")
def stack(repository, tmp_path_factory):
    models = ("minilm", MODEL, f"{MODEL}_owner")
    own = fault_stack(repository, tmp_path_factory.mktemp("split-faults"), models)
    yield own
    assert own.stop() == 0


def stubs_serving(triton: int, entry: str) -> list[int]:
    """The stubs of one model entry."""
    return sorted(pid for pid in child_stubs(triton) if stub_model(pid) == entry)


class InFlight:
    """Requests sent from threads; each outcome is ("answered", s) or (the error's text, s)."""

    def __init__(self, stack, count: int, rows=LONG, protocol: str = "grpc") -> None:
        self.outcomes: list[tuple[str, float]] = []
        self.threads = [
            threading.Thread(target=self._send, args=(stack, rows, protocol)) for _ in range(count)
        ]
        for t in self.threads:
            t.start()

    def _send(self, stack, rows, protocol) -> None:
        started = time.monotonic()
        # freed on the thread that made it: the HTTP client's __del__ joins its gevent pool,
        # which raises on a thread without its hub. Only the error's text is kept: its
        # traceback holds tritonclient's own frames, whose `self` is the client, and would let
        # the garbage collector free the client on any thread.
        sender = client(stack, protocol)
        try:
            infer(sender, MODEL, text_inputs(protocol, rows))
            self.outcomes.append(("answered", time.monotonic() - started))
        except Exception as err:
            self.outcomes.append((str(err), time.monotonic() - started))
        finally:
            del sender

    def join(self, timeout_s: float) -> None:
        for t in self.threads:
            t.join(timeout_s)


def back_within(stack, text, expected, timeout_s: float) -> float:
    """Seconds until three requests in a row are answered (right, when ``expected`` is given)."""
    started, in_a_row = time.monotonic(), 0
    while time.monotonic() - started < timeout_s and in_a_row < 3:
        try:
            embedding, _ = infer(client(stack, "http"), MODEL, text_inputs("http", [text]))
            right = expected is None or np.abs(embedding - expected).max() <= TOLERANCE
            in_a_row = in_a_row + 1 if right else 0
            continue
        except Exception:
            in_a_row = 0
        time.sleep(0.1)
    return time.monotonic() - started


def test_a_killed_owner_is_reloaded_alone_and_its_requests_end_at_once(
    stack, tokenizer, reference_model
):
    text = "back after the queue owner died"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    triton = stack.triton_pid()
    others = stubs_serving(triton, "minilm")
    flights = InFlight(stack, 4)
    time.sleep(0.5)
    (owner,) = stubs_serving(triton, f"{MODEL}_owner")
    killed_at = time.monotonic()
    os.kill(owner, signal.SIGKILL)
    flights.join(30)
    back_after = back_within(stack, text, expected, 60)
    assert len(flights.outcomes) == 4, "no in-flight request hangs"
    for outcome, seconds in flights.outcomes:
        if outcome != "answered":  # ended at once with the reason, not at a timeout
            assert "queue owner" in str(outcome) and "UNAVAILABLE" in str(outcome), outcome
            assert time.monotonic() - killed_at < 15 and seconds < 20
    assert back_after < 30, f"the model was not back after {back_after:.0f} s"
    assert f"reloading {MODEL}_owner" in stack.output()
    assert stack.triton_pid() == triton, "Triton itself was not restarted"
    assert stubs_serving(triton, "minilm") == others, "other models were not touched"


def test_a_killed_front_ends_every_request_and_the_model_comes_back(
    stack, tokenizer, reference_model
):
    text = "back after a front died"
    expected = reference_model(tokenizer.encode([text], truncate=True))
    triton = stack.triton_pid()
    flights = InFlight(stack, 6)
    time.sleep(0.5)
    front = stubs_serving(triton, MODEL)[0]
    os.kill(front, signal.SIGKILL)
    flights.join(45)
    back_after = back_within(stack, text, expected, 60)
    assert len(flights.outcomes) == 6, "no in-flight request hangs"
    for outcome, seconds in flights.outcomes:
        assert outcome == "answered" or "unavailable" in str(outcome).lower(), outcome
        assert seconds < 30, seconds
    assert back_after < 45, f"the model was not back after {back_after:.0f} s"


def test_a_stopped_front_holds_up_only_its_own_requests(stack):
    """Measured on Triton 2.51: a request Triton hands a stopped stub fails within about 1 s
    ("Stub process ... is not healthy"), the running front answers the others, and the server
    aborts when the stub resumes; the watchdog restarts it (at its probe's first 500, or at the
    abort), so every request ends and the model comes back."""
    triton = stack.triton_pid()
    fronts = stubs_serving(triton, MODEL)
    assert len(fronts) == 2
    os.kill(fronts[0], signal.SIGSTOP)
    try:
        stopped_at = time.monotonic()
        flights = InFlight(stack, 8, rows=["short row"] * 4, protocol="http")
        time.sleep(10)
        answered_while_stopped = sum(1 for o, _ in flights.outcomes if o == "answered")
    finally:
        with contextlib.suppress(ProcessLookupError):  # a Triton restart took it
            os.kill(fronts[0], signal.SIGCONT)
    flights.join(40)
    assert answered_while_stopped >= 1, flights.outcomes
    assert len(flights.outcomes) == 8, "every request ends"
    assert time.monotonic() - stopped_at < 60
    back = back_within(stack, "after a front stopped", None, 90)
    assert back < 90, f"the model was not serving {back:.0f} s after the front resumed"
