"""The Grafana dashboard (deploy/grafana/planner-dashboard.json) plots only what the model
publishes: every metric and label its queries name is read back from a live scrape of the real
server after it served, refused and planned a few requests."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

from testkit.prometheus import scrape
from testkit.triton_clients import client, infer, infer_error, text_inputs

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "planner-dashboard.json"
METRIC = re.compile(r"\b((?:planner|nv)_[a-z_]+)\b")
MATCHER = re.compile(r"\b([a-z_]+)\s*(?:=~|!=|=)\s*\"")
GROUPING = re.compile(r"\bby\s*\(([^)]*)\)")


def queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    out = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    out += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    return out


def test_every_metric_and_label_the_dashboard_queries_is_published(server):
    c = client(server, "http")
    for texts in (["one row"], ["two rows", "of a request with a longer second row"]):
        infer(c, "minilm", text_inputs("http", texts))
    infer_error(c, "minilm", text_inputs("http", ["   "]))  # refused: counted by its reason
    time.sleep(0.8)  # the model publishes its metrics at most every 0.25 s
    samples = scrape(f"http://127.0.0.1:{server.metrics_port}/metrics")
    labels_of: dict[str, set[str]] = {}
    for s in samples:
        labels_of.setdefault(s.name, set()).update(s.labels)
    exprs = queries()
    assert len(exprs) >= 11
    for expr in exprs:
        names = METRIC.findall(expr)
        assert names, expr
        missing = [n for n in names if n not in labels_of]
        assert not missing, f"{missing} is not published (query: {expr})"
        used = set(MATCHER.findall(expr))
        for group in GROUPING.findall(expr):
            used |= {label.strip() for label in group.split(",") if label.strip()}
        if "label_values(" in expr:
            used.add(expr.split(",")[-1].strip(" )"))
        published = set().union(*(labels_of[n] for n in names))
        assert used <= published, f"{used - published} not on {names} (query: {expr})"
    # the four stages of a request, each a histogram with observations from this test
    for stage in ("queue", "tokenization", "inference"):
        counts = [
            s.value
            for s in samples
            if s.name == f"planner_request_{stage}_seconds_count" and s.labels["model"] == "minilm"
        ]
        assert counts and sum(counts) >= 2, stage
    totals = [s.value for s in samples if s.name == "planner_request_seconds_count"]
    assert sum(totals) >= 2
