"""The Triton metrics adapter: updates are batched, and a failing metric never fails serving."""

from __future__ import annotations

from python_backend.common.contract import Reason
from python_backend.stub.metrics import TritonMetrics
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
                (
                    ("class", "1"),
                    ("model", "m"),
                    ("model_instance", "m"),
                    ("reason", "queue_full"),
                ),
            )
        ]
        == 2
    )
    assert calls[("set", "planner_queue_rows", (("model", "m"), ("model_instance", "m")))] == 0
    assert not [c for c in pb.calls if c[0] == "observe"], "histograms are published as counters"
    latency16 = {
        dict(labels).get("le"): value
        for op, name, labels, value in pb.calls
        if name.startswith("planner_forward_seconds") and dict(labels)["bucket"] == "16"
    }
    counts16 = [v for op, name, labels, v in pb.calls if name == "planner_forward_seconds_count"]
    assert sorted(counts16) == [1, 2]  # the forwards at 64 tokens, and at 16
    assert latency16["0.01"] == 1 and latency16["0.02"] == 2 and latency16["+Inf"] == 2
    assert "0.005" not in latency16, "a bucket below every value is not sent"
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


def published(pb: RecordingPbUtils, name: str) -> dict[str | None, float]:
    """What one flush sent of one histogram: its bucket increments by ``le``, its sum and
    count (under None and "count")."""
    out: dict[str | None, float] = {}
    for op, family, labels, value in pb.calls:
        assert op == "increment", op
        if family == f"{name}_bucket":
            out[dict(labels)["le"]] = value
        elif family == f"{name}_sum":
            out[None] = value
        elif family == f"{name}_count":
            out["count"] = value
    return out


def test_a_histogram_publishes_its_cumulative_buckets_sum_and_count_once_per_flush():
    from python_backend.stub.metrics import Histogram

    pb = RecordingPbUtils()
    series = Histogram(pb.MetricFamily, "h_seconds", "test", [0.001, 0.01, 0.1]).series({"m": "x"})
    # a value on a bound counts in that bound's bucket (le: less than or equal)
    series.publish([0.01, 0.005, 0.2, 0.0005, 0.01])
    sent = published(pb, "h_seconds")
    assert sent == {
        "0.001": 1,
        "0.01": 4,
        "0.1": 4,
        "+Inf": 5,
        None: 0.01 + 0.005 + 0.2 + 0.0005 + 0.01,
        "count": 5,
    }
    pb.calls.clear()
    series.publish([0.05])  # only what is new, and nothing for the buckets below it
    assert published(pb, "h_seconds") == {"0.1": 1, "+Inf": 1, None: 0.05, "count": 1}
    pb.calls.clear()
    series.publish([])
    assert pb.calls == []


def test_request_stages_are_published_as_the_histograms_the_dashboard_reads():
    pb = RecordingPbUtils()
    metrics = TritonMetrics(pb, "m")
    metrics.request_stage("tokenization", 0.0003)
    metrics.request_stage("total", 0.004)
    metrics.request_stage("total", 0.004)
    metrics.answered(0.002, 0.0015)
    metrics.flush()
    assert published(pb, "planner_request_seconds")["count"] == 2
    assert published(pb, "planner_request_seconds")["0.005"] == 2
    assert published(pb, "planner_request_tokenization_seconds")["0.0005"] == 1
    assert published(pb, "planner_request_queue_seconds")["0.002"] == 1
    assert published(pb, "planner_request_inference_seconds")["0.002"] == 1
