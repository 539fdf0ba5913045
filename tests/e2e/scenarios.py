"""Scenarios several end-to-end suites run: against Triton's own port or through the front door."""

from __future__ import annotations

import threading
import time

import tritonclient.grpc as grpcclient

from testkit.triton_clients import client, infer, text_inputs
from tests.e2e.test_serving import total


def long_texts(n: int) -> list[str]:
    return ["a long paragraph of words " * 60] * n


def busy(target, rows: int = 64, headers: dict | None = None) -> threading.Thread:
    """Keeps the model busy with one large request (about a second of CPU) in the background."""
    thread = threading.Thread(
        target=lambda: infer(
            client(target, "http"),
            "minilm",
            text_inputs("http", long_texts(rows)),
            headers=dict(headers or {}),
        )
    )
    thread.start()
    time.sleep(0.15)  # let it reach the engine
    return thread


def cancel_while_busy(target, headers: dict | None = None) -> tuple[float, float]:
    """A 3-row gRPC request queued behind a 64-row load, cancelled by its client. Returns
    (cancellations the model counted, rows it computed) once its metrics settle: (1, 64) when the
    cancellation reached the model before the request cost anything."""
    before = total(target, "planner_refused_total", reason="cancelled")
    rows_before = total(target, "planner_rows_total", model="minilm")
    load = busy(target, headers=headers)
    future = grpcclient.InferenceServerClient(target.grpc_url).async_infer(
        "minilm",
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
    return cancelled, total(target, "planner_rows_total", model="minilm") - rows_before
