"""A few seconds of perf_analyzer against the real server: no errors under load."""

from __future__ import annotations

import json
from pathlib import Path

from tools.perf_analyzer import run_perf_analyzer

ROOT = Path(__file__).resolve().parents[2]


def test_perf_analyzer_at_concurrency_4_sees_no_errors(server, tmp_path):
    row, output = run_perf_analyzer(
        "minilm",
        server.grpc_url,
        ROOT / "bench" / "data" / "perf_input.json",
        concurrency=4,
        csv_path=tmp_path / "smoke.csv",
        measurement_ms=1000,
        max_trials=3,
        stability_percent=1000,  # a smoke test: any stable-enough window will do
    )
    assert row.rows_per_s > 0
    assert "error" not in output.lower(), output[-2000:]


def test_perf_analyzer_sending_token_ids_is_served_the_rows_the_model_makes_of_the_texts(
    server, repository, tmp_path
):
    """bench's token-id load (clients that tokenize): each request one INPUT_IDS row, the row
    the model's own tokenizer (read here straight from the tokenizers library) makes of the
    same text; perf_analyzer sends it to the real server with no errors."""
    from tokenizers import Tokenizer

    from bench.harness import token_id_input_data
    from bench.paths import INPUT_DATA
    from python_backend.common.manifest import load_manifest

    version = repository / "minilm" / "1"
    data = token_id_input_data(version, tmp_path / "ids.json")
    sent = [d["INPUT_IDS"] for d in json.loads(data.read_text())["data"]]
    texts = [d["TEXT"]["content"][0] for d in json.loads(INPUT_DATA.read_text())["data"]]
    reference = Tokenizer.from_file(str(version / "tokenizer.json"))
    reference.no_padding()  # the file pads; the model pads to its buckets itself
    reference.enable_truncation(load_manifest(version).max_length)
    assert len(sent) == len(texts)
    for ids, text in zip(sent, texts, strict=True):
        assert ids["content"] == reference.encode(text).ids and ids["shape"] == [
            len(ids["content"])
        ]
    row, output = run_perf_analyzer(
        "minilm",
        server.grpc_url,
        data,
        concurrency=4,
        csv_path=tmp_path / "ids.csv",
        measurement_ms=1000,
        max_trials=3,
        stability_percent=1000,
    )
    assert row.rows_per_s > 0
    assert "error" not in output.lower(), output[-2000:]
