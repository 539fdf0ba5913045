"""The Triton metrics adapter: updates are batched, and a failing metric never fails serving."""

from __future__ import annotations

from python_backend.contract import Reason
from python_backend.metrics import TritonMetrics
from testkit.recording_pb_utils import RecordingPbUtils


def test_updates_wait_for_a_flush_and_are_sent_aggregated():
    pb = RecordingPbUtils()
    metrics = TritonMetrics(pb, "m")
    metrics.queue_depth(5)
    metrics.forward(16, 4, 40, 0.01)
    metrics.forward(16, 2, 20, 0.02)
    metrics.forward(64, 1, 50, 0.03)
    metrics.plan(100.0, 120.0)
    metrics.refused(Reason.QUEUE_FULL)
    metrics.refused(Reason.QUEUE_FULL)
    metrics.queue_depth(0)
    assert pb.calls == [], "nothing crosses to the server before a flush"
    metrics.flush()
    calls = {(op, name, labels): value for op, name, labels, value in pb.calls if op != "observe"}
    bucket16 = (("bucket", "16"), ("model", "m"), ("model_instance", "m"))
    assert calls[("increment", "planner_rows_total", bucket16)] == 6
    assert calls[("increment", "planner_forwards_total", bucket16)] == 2
    assert (
        calls[
            (
                "increment",
                "planner_tokens_total",
                (("kind", "real"), ("model", "m"), ("model_instance", "m")),
            )
        ]
        == 110
    )
    assert (
        calls[
            (
                "increment",
                "planner_tokens_total",
                (("kind", "padded"), ("model", "m"), ("model_instance", "m")),
            )
        ]
        == 6 * 16 + 64
    )
    assert (
        calls[
            (
                "increment",
                "planner_refused_total",
                (("model", "m"), ("model_instance", "m"), ("reason", "queue_full")),
            )
        ]
        == 2
    )
    assert calls[("set", "planner_queue_rows", (("model", "m"), ("model_instance", "m")))] == 0
    assert sorted(v for op, *_, v in pb.calls if op == "observe") == [0.01, 0.02, 0.03]
    pb.calls.clear()
    metrics.flush()
    assert pb.calls == [], "a flush sends only what is new"


def test_a_metric_that_fails_is_logged_once_and_never_raises():
    pb = RecordingPbUtils(fail=True)
    metrics = TritonMetrics(pb, "m")
    metrics.forward(16, 1, 5, 0.01)
    metrics.flush()
    metrics.refused(Reason.TIMEOUT)
    metrics.flush()
    assert len(pb.warnings) == 1 and "metrics disabled" in pb.warnings[0]


def test_instances_of_one_model_publish_separate_series_that_add_up():
    """One instance per GPU: each queue depth is its own series, none overwrites another."""
    pb = RecordingPbUtils()
    gpu0, gpu1 = TritonMetrics(pb, "m", "m_0_0"), TritonMetrics(pb, "m", "m_0_1")
    gpu0.queue_depth(7)
    gpu1.queue_depth(5)
    gpu0.forward(16, 4, 40, 0.01)
    gpu1.forward(16, 2, 20, 0.01)
    gpu0.flush()
    gpu1.flush()
    depths = {
        dict(labels)["model_instance"]: value
        for op, name, labels, value in pb.calls
        if name == "planner_queue_rows"
    }
    assert depths == {"m_0_0": 7, "m_0_1": 5}
    rows = [value for op, name, labels, value in pb.calls if name == "planner_rows_total"]
    assert sorted(rows) == [2, 4]


def test_the_refusal_table_of_the_docs_is_the_reason_enum_with_its_statuses():
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "RELIABILITY.md").read_text()
    section = text.split("## Refusals and failures, by reason", 1)[1].split("\n## ", 1)[0]
    rows = dict(re.findall(r"^\| `([a-z_]+)` \| ([^|]+?) \|", section, re.M))
    assert set(rows) == {reason.value for reason in Reason}
    status = {
        "INVALID_ARG": "400 / INVALID_ARGUMENT",
        "UNAVAILABLE": "503 / UNAVAILABLE",
        "CANCELLED": "400 / CANCELLED",
        "INTERNAL": "500 / INTERNAL",
    }
    for reason in Reason:
        assert rows[reason.value] == status[reason.kind.triton_code], reason
