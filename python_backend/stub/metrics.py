"""Scheduler metrics as Triton custom metrics (served on the metrics port, Prometheus format)."""

from __future__ import annotations

import bisect
import functools
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any, TypeVar

from python_backend.common.contract import INSTANCE_LABEL, QUEUE_DEPTH_METRIC, Reason
from python_backend.scheduling.scheduler import SchedulerMetrics

F = TypeVar("F", bound=Callable[..., None])


def never_raises(method: F) -> F:
    """A metric that cannot be recorded must not fail the request that was being served."""

    @functools.wraps(method)
    def wrapper(self: TritonMetrics, *args: Any) -> None:
        try:
            method(self, *args)
        except Exception as err:
            if not self._warned:
                self._warned = True
                self._log(f"metrics disabled after an error: {err!r}")

    return wrapper  # type: ignore[return-value]


# how stale the served metrics may get: the scheduler publishes at most this often, between
# forwards and when it wakes idle (every 0.25 s)
FLUSH_INTERVAL_S = 0.25
LATENCY_BUCKETS_S = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0]
# where a request's time went, one histogram each, per model and instance (TEI's te_request_*):
# the model's own queue (Triton's queue metric never sees it), tokenizing it, computing it (its
# first forward's start to its last row), and the whole request (decoding to its answer)
STAGES = {
    "queue": "planner_request_queue_seconds",
    "tokenization": "planner_request_tokenization_seconds",
    "inference": "planner_request_inference_seconds",
    "total": "planner_request_seconds",
}
STAGE_BUCKETS_S = [
    0.0001, 0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0,
    5.0, 10.0, 30.0,
]  # fmt: skip


class Histogram:
    """A Prometheus histogram kept in this process and published as its own series, each a
    counter: ``NAME_bucket`` (one per ``le``, cumulative, ``+Inf`` last), ``NAME_sum`` and
    ``NAME_count``, which ``histogram_quantile`` reads as it reads a histogram's. Triton's own
    histogram takes one ``observe`` per value, each a message from the stub to the server that
    waits for its reply: two per request in a front and two in the owner. Published this way, a
    flush sends at most one increment per series, however many values it carries."""

    def __init__(self, mf: Any, name: str, description: str, bounds: list[float]) -> None:
        self.bounds = bounds
        self.families = [
            mf(name=f"{name}{suffix}", description=description, kind=mf.COUNTER)
            for suffix in ("_bucket", "_sum", "_count")
        ]

    def series(self, labels: dict[str, str]) -> HistogramSeries:
        return HistogramSeries(self, labels)


class HistogramSeries:
    """One label set of a ``Histogram``."""

    def __init__(self, histogram: Histogram, labels: dict[str, str]) -> None:
        # Triton requires every MetricFamily to outlive its Metrics: the series keeps its own
        self.histogram = histogram
        buckets, total, count = histogram.families
        self._buckets = [
            buckets.Metric(labels={**labels, "le": le})
            for le in [f"{b:g}" for b in histogram.bounds] + ["+Inf"]
        ]
        self._sum = total.Metric(labels=labels)
        self._count = count.Metric(labels=labels)

    def publish(self, values: list[float]) -> None:
        """Adds ``values`` (observed since the last publish) to the served series."""
        if not values:
            return
        counts = [0] * (len(self.histogram.bounds) + 1)
        for value in values:  # a value counts in the first bucket whose bound it does not pass
            counts[bisect.bisect_left(self.histogram.bounds, value)] += 1
        below = 0
        for metric, count in zip(self._buckets, counts, strict=True):
            below += count
            if below:  # the buckets below the smallest value gain nothing
                metric.increment(below)
        self._sum.increment(sum(values))
        self._count.increment(len(values))


class TritonMetrics(SchedulerMetrics):
    """Families are created once per model instance; labels carry the model, the instance and
    the bucket. With one instance per GPU, each instance's queue depth is its own series (sum
    them for the model's), instead of every instance overwriting one gauge."""

    def __init__(self, pb_utils: Any, model_name: str, instance: str | None = None) -> None:
        mf = pb_utils.MetricFamily
        self._warned = False
        self._log = pb_utils.Logger.log_warn
        self._lock = threading.Lock()
        # (what, label) -> amount pending; plan costs are fractional token-units, hence float
        self._counts: defaultdict[tuple[str, str | int | tuple[str, int] | None], float] = (
            defaultdict(float)
        )
        # values pending, by the series they go to: forward seconds by bucket, request seconds
        # by stage
        self._latencies: defaultdict[int, list[float]] = defaultdict(list)
        self._stage_times: defaultdict[str, list[float]] = defaultdict(list)
        self._queue_rows: int | None = None  # latest queue depth, pending
        self._last_flush = time.monotonic()
        self._model = model_name
        self._instance = instance or model_name
        base = {"model": model_name, INSTANCE_LABEL: self._instance}
        # Triton requires every MetricFamily to outlive its Metrics: all are kept on self
        self._queue_family = mf(
            name=QUEUE_DEPTH_METRIC,
            description="Rows waiting in the model's own queue",
            kind=mf.GAUGE,
        )
        self._queue = self._queue_family.Metric(labels=base)
        self._rows = mf(
            name="planner_rows_total", description="Rows computed, by bucket", kind=mf.COUNTER
        )
        self._forwards = mf(
            name="planner_forwards_total", description="Forwards run, by bucket", kind=mf.COUNTER
        )
        self._tokens_family = tokens = mf(
            name="planner_tokens_total",
            description="Tokens computed: real (in rows) and padded (rows x bucket length)",
            kind=mf.COUNTER,
        )
        self._real = tokens.Metric(labels={**base, "kind": "real"})
        self._padded = tokens.Metric(labels={**base, "kind": "padded"})
        self._cost_family = cost = mf(
            name="planner_plan_cost_total",
            description="Cost of the plans run, in token-units: planned, and per-bucket grouping of the same rows",
            kind=mf.COUNTER,
        )
        self._planned = cost.Metric(labels={**base, "plan": "planned"})
        self._baseline = cost.Metric(labels={**base, "plan": "per_bucket"})
        self._refused = mf(
            name="planner_refused_total",
            description="Requests refused or failed, by reason",
            kind=mf.COUNTER,
        )
        self._splits_family = mf(
            name="planner_split_total",
            description="Forwards that failed and were split and retried",
            kind=mf.COUNTER,
        )
        self._splits = self._splits_family.Metric(labels=base)
        self._latency = Histogram(
            mf, "planner_forward_seconds", "Forward latency in seconds", LATENCY_BUCKETS_S
        )
        self._stages = {
            stage: Histogram(
                mf,
                name,
                f"Seconds of a request's {stage}"
                if stage != "total"
                else "Seconds of a request, from decoding it to its answer",
                STAGE_BUCKETS_S,
            ).series(base)
            for stage, name in STAGES.items()
        }
        self._by_bucket: dict[int, tuple[Any, Any, HistogramSeries]] = {}
        self._by_reason: dict[tuple[str, int], Any] = {}
        # per service class (label "class"): rows answered, and seconds queued and in all
        self._class_rows_family = mf(
            name="planner_class_rows_total",
            description="Rows answered with outputs, by service class",
            kind=mf.COUNTER,
        )
        self._class_times = {
            stage: Histogram(mf, name, description, STAGE_BUCKETS_S)
            for stage, name, description in (
                ("queue", "planner_class_queue_seconds", "Seconds a request queued, by class"),
                (
                    "request",
                    "planner_class_request_seconds",
                    "Seconds from a request's arrival in the queue to its answer, by class",
                ),
            )
        }
        self._by_class: dict[int, tuple[Any, dict[str, HistogramSeries]]] = {}
        self._class_values: defaultdict[tuple[int, str], list[float]] = defaultdict(list)

    def _bucket(self, padded_length: int) -> tuple[Any, Any, HistogramSeries]:
        metrics = self._by_bucket.get(padded_length)
        if metrics is None:
            labels = {
                "model": self._model,
                INSTANCE_LABEL: self._instance,
                "bucket": str(padded_length),
            }
            latency = self._latency.series(labels)
            metrics = (
                self._rows.Metric(labels=labels),
                self._forwards.Metric(labels=labels),
                latency,
            )
            self._by_bucket[padded_length] = metrics
        return metrics

    # -- updates are recorded here and sent to Triton in batches: each Metric call is a message
    # to the server process, and five of them per forward cost more than the forward on a GPU

    def queue_depth(self, rows: int) -> None:
        with self._lock:
            self._queue_rows = rows

    def forward(self, padded_length: int, rows: int, real_tokens: int, seconds: float) -> None:
        with self._lock:
            self._counts[("rows", padded_length)] += rows
            self._counts[("forwards", padded_length)] += 1
            self._counts[("tokens", "real")] += real_tokens
            self._counts[("tokens", "padded")] += rows * padded_length
            self._latencies[padded_length].append(seconds)

    def plan(self, planned_cost: float, per_bucket_cost: float) -> None:
        with self._lock:
            self._counts[("cost", "planned")] += planned_cost
            self._counts[("cost", "per_bucket")] += per_bucket_cost

    def refused(self, reason: Reason, priority: int = 1) -> None:
        with self._lock:
            self._counts[("refused", (reason.value, priority))] += 1

    def split(self, padded_length: int, rows: int) -> None:
        with self._lock:
            self._counts[("split", None)] += 1

    def answered(
        self, queue_s: float, inference_s: float, priority: int = 1, rows: int = 1
    ) -> None:
        with self._lock:
            self._stage_times["queue"].append(queue_s)
            self._stage_times["inference"].append(inference_s)
            self._counts[("class_rows", priority)] += rows
            self._class_values[(priority, "queue")].append(queue_s)
            self._class_values[(priority, "request")].append(queue_s + inference_s)

    def request_stage(self, stage: str, seconds: float) -> None:
        """Where the model glue times a request: its tokenization, the whole of it."""
        with self._lock:
            self._stage_times[stage].append(seconds)

    def flush_if_due(self) -> None:
        if time.monotonic() - self._last_flush >= FLUSH_INTERVAL_S:
            self.flush()

    @never_raises
    def flush(self) -> None:
        """Sends what was recorded since the last flush to Triton."""
        with self._lock:
            counts, self._counts = self._counts, defaultdict(float)
            latencies, self._latencies = self._latencies, defaultdict(list)
            stage_times, self._stage_times = self._stage_times, defaultdict(list)
            class_values, self._class_values = self._class_values, defaultdict(list)
            queue_rows, self._queue_rows = self._queue_rows, None
            self._last_flush = time.monotonic()
        for (kind, key), amount in counts.items():
            if kind in ("rows", "forwards"):
                assert isinstance(key, int)
                rows_metric, forwards_metric, _ = self._bucket(key)
                (rows_metric if kind == "rows" else forwards_metric).increment(amount)
            elif kind == "tokens":
                (self._real if key == "real" else self._padded).increment(amount)
            elif kind == "cost":
                (self._planned if key == "planned" else self._baseline).increment(amount)
            elif kind == "refused":
                assert isinstance(key, tuple)
                self._refused_metric(*key).increment(amount)
            elif kind == "class_rows":
                assert isinstance(key, int)
                self._class(key)[0].increment(amount)
            elif kind == "split":
                self._splits.increment(amount)
        for padded_length, values in latencies.items():
            self._bucket(padded_length)[2].publish(values)
        for stage, values in stage_times.items():
            self._stages[stage].publish(values)
        for (priority, stage), values in class_values.items():
            self._class(priority)[1][stage].publish(values)
        if queue_rows is not None:
            self._queue.set(queue_rows)

    def _refused_metric(self, reason: str, priority: int) -> Any:
        metric = self._by_reason.get((reason, priority))
        if metric is None:
            metric = self._refused.Metric(
                labels={
                    "model": self._model,
                    INSTANCE_LABEL: self._instance,
                    "reason": reason,
                    "class": str(priority),
                }
            )
            self._by_reason[(reason, priority)] = metric
        return metric

    def _class(self, priority: int) -> tuple[Any, dict[str, HistogramSeries]]:
        metrics = self._by_class.get(priority)
        if metrics is None:
            labels = {"model": self._model, INSTANCE_LABEL: self._instance, "class": str(priority)}
            metrics = (
                self._class_rows_family.Metric(labels=labels),
                {stage: h.series(labels) for stage, h in self._class_times.items()},
            )
            self._by_class[priority] = metrics
        return metrics
