"""A short soak against the real server (bench/soak.py runs the long one)."""

from __future__ import annotations

from bench.soak import report, run_soak
from builder.corpus import corpus_rows
from tests.e2e.test_serving import total


def test_a_short_soak_answers_every_valid_request_right(server, reference_model, tokenizer):
    texts = corpus_rows(120, seed=99)
    rows = tokenizer.encode(texts, truncate=True)
    reference = dict(enumerate(reference_model(rows)))
    second = {"model": "minilm", "class": "2"}
    before = total(server, "planner_class_rows_total", **second)
    result = run_soak(server, reference, texts, seconds=4, clients=64)
    print(report(result, 64))
    assert result.ok, result.wrong[:5]
    assert result.counts["valid: right answer"] > 50
    assert result.counts["invalid: refused"] > 5
    assert result.counts["valid: ERROR"] == 0 and result.counts["valid: WRONG"] == 0
    assert server.ready()
    assert total(server, "planner_class_rows_total", **second) > before, "class 2 was served"
