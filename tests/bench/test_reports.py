"""The benchmark reports' prose lives in bench/templates; every report fills in exactly the
fields its template asks for (checked on the source, without running a benchmark)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from bench import docs

BENCH = Path(docs.__file__).resolve().parent


def render_calls() -> list[tuple[str, str, set[str]]]:
    """(file, template, keyword names) of every ``render("name", ...)`` call in bench/."""
    calls = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "render"):
                continue
            assert node.args and isinstance(node.args[0], ast.Constant), (
                f"{path.name}: render's template is named by a literal"
            )
            assert all(k.arg is not None for k in node.keywords), (
                f"{path.name}: render's fields are named one by one, not passed as **mapping"
            )
            calls.append((path.name, node.args[0].value, {k.arg for k in node.keywords}))
    return calls


def test_every_report_fills_exactly_its_templates_fields():
    calls = render_calls()
    assert calls, "no report calls render: the test would check nothing"
    for file, name, given in calls:
        assert given == docs.template_fields(name), f"{file}: render({name!r})"


def test_every_template_is_used_by_a_report():
    used = {name for _, name, _ in render_calls()}
    assert {p.stem for p in docs.TEMPLATES.glob("*.md")} == used


def test_render_names_a_missing_and_an_unused_field(tmp_path, monkeypatch):
    (tmp_path / "t.md").write_text("## $title\n\n${table}\n\ncosts $$5\n")
    monkeypatch.setattr(docs, "TEMPLATES", tmp_path)
    assert docs.render("t", title="A", table="| x |") == "## A\n\n| x |\n\ncosts $5"
    with pytest.raises(ValueError, match=r"missing \['table'\].*unused \['tabel'\]"):
        docs.render("t", title="A", tabel="| x |")
    (tmp_path / "bad.md").write_text("costs $5\n")
    with pytest.raises(ValueError, match=r"a `\$` that names no field"):
        docs.render("bad")
    with pytest.raises(ValueError, match="no report template"):
        docs.render("absent")


def test_the_serving_report_compares_each_model_with_the_peer_at_its_own_load():
    from bench.harness import MODELS, PEER, MachineLoad
    from bench.serving import Run, report
    from tools.perf_analyzer import PerfPoint

    def at(c: int, model: str, rate: float, p99: float, stable: bool = True) -> Run:
        point = PerfPoint(rate, p99 / 2, p99 * 0.8, p99)
        return Run(0, c, model, point, "" if stable else "unstable")

    load = MachineLoad(sample_s=0)
    load.busy_before, load.start = 0.25, [0] * 10
    rates = {"planner_dp": 300.0, "planner_per_bucket": 200.0, PEER: 100.0}
    runs = [at(c, m, rates[m] * c, 10.0 * c, stable=m != PEER) for c in (8, 64) for m in MODELS]
    text = report(
        runs,
        60000.0,
        [10, 20, 30],
        ["[2/6] choose buckets"],
        [8, 64],
        4000,
        3200.0,
        [at(1, m, 1.0, 5.0 if m == PEER else 4.0) for m in ("planner_dp", PEER)],
        load,
    )
    assert "| 64 | planner_dp | 19200.0 | 384000 | 320 | 512 | 640 | 3.00x | 1.00x |" in text
    assert (
        "| 8 | dynamic_batcher | 800.0 | 16000 | 40 | 64 | 80 | 1.00x | 1.00x | (unstable)" in text
    )
    assert "Server efficiency (best served over the limit): 32%." in text
    assert "| planner_dp | 2 | 4 | 0.80x |" in text
    assert "The machine was 25% busy in the second before the run" in text
    assert "$" not in text


def test_the_machine_load_is_the_busy_share_before_and_the_hosts_steal_during(monkeypatch):
    from bench import harness

    ticks = iter(
        [
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            [100, 0, 50, 800, 50, 0, 0, 0, 0, 0],  # the second before: 150 of 1000 busy
            [200, 0, 100, 1500, 50, 0, 0, 150, 0, 0],  # the run: 150 of 1000 stolen
        ]
    )
    monkeypatch.setattr(harness, "cpu_times", lambda: next(ticks))
    load = harness.MachineLoad(sample_s=0)
    assert load.describe() == (
        "The machine was 15% busy in the second before the run; the host took 15.0% of its CPU "
        "time during it."
    )


def test_a_window_in_which_nothing_finished_is_doubled_and_noted(monkeypatch, tmp_path):
    from bench import harness
    from tools.perf_analyzer import PerfPoint

    windows = []

    def perf_analyzer(*args, measurement_ms, stability_percent, **kwargs):
        windows.append((measurement_ms, stability_percent))
        if len(windows) < 3:
            raise RuntimeError("No valid requests recorded within time interval.")
        return PerfPoint(5.0, 1.0, 2.0, 3.0), ""

    monkeypatch.setattr(harness, "run_perf_analyzer", perf_analyzer)
    point, note = harness.measure("m", "url", 64, tmp_path, 4000)
    assert windows == [(4000, 30), (8000, 30), (16000, 30)]
    assert point.rows_per_s == 5.0 and note == "4x window"
