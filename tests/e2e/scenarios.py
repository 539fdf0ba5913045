"""Scenarios several end-to-end suites run: against Triton's own port or through the front door."""

from __future__ import annotations

import threading
import time

import tritonclient.grpc as grpcclient

from testkit.triton_clients import client, infer, text_inputs
from tests.e2e.conftest import SLOW
from tests.e2e.test_serving import total


def long_texts(n: int) -> list[str]:
    return ["a long paragraph of words " * 60] * n


def busy(target, headers: dict | None = None) -> threading.Thread:
    """Keeps ``SLOW`` busy in the background: one short row, whose forward takes a second."""
    thread = threading.Thread(
        target=lambda: infer(
            client(target, "http"), SLOW, text_inputs("http", ["busy"]), headers=dict(headers or {})
        )
    )
    thread.start()
    time.sleep(0.15)  # let it reach the engine
    return thread


def cancel_while_busy(target, headers: dict | None = None) -> tuple[float, float]:
    """A 3-row gRPC request queued behind a one-row load, cancelled by its client. Returns
    (cancellations the model counted, rows it computed) once its metrics settle: (1, 1) when the
    cancellation reached the model before the request cost anything."""
    before = total(target, "planner_refused_total", reason="cancelled")
    rows_before = total(target, "planner_rows_total", model=SLOW)
    load = busy(target, headers=headers)
    future = grpcclient.InferenceServerClient(target.grpc_url).async_infer(
        SLOW,
        text_inputs("grpc", ["never computed"] * 3),
        callback=lambda *_: None,
        headers=dict(headers or {}),
    )
    time.sleep(0.05)
    future.cancel()
    load.join()
    deadline = time.monotonic() + 10
    while (
        time.monotonic() < deadline
        and total(target, "planner_refused_total", settle=False, reason="cancelled") == before
    ):
        time.sleep(0.1)
    cancelled = total(target, "planner_refused_total", reason="cancelled") - before
    return cancelled, total(target, "planner_rows_total", model=SLOW) - rows_before
