from __future__ import annotations

from pathlib import Path

from builder.cli import MODEL_PY
from builder.triton_config import model_config, read_config, write_config

ROOT = Path(__file__).resolve().parents[2]


def test_generated_config_parses_as_triton_model_config(tmp_path):
    write_config(model_config("m", "LOGITS", 3, {"max_queue_rows": "10"}), tmp_path)
    config = read_config(tmp_path / "config.pbtxt")
    assert config.name == "m" and config.backend == "python" and config.max_batch_size == 64
    assert [i.name for i in config.input] == ["TEXT", "INPUT_IDS", "ATTENTION_MASK"]
    assert all(i.optional for i in config.input)
    assert [(o.name, list(o.dims)) for o in config.output] == [("LOGITS", [3]), ("NUM_TOKENS", [1])]
    assert config.parameters["max_queue_rows"].string_value == "10"
    assert not config.HasField("dynamic_batching"), "the model batches for itself"
    assert not config.model_transaction_policy.decoupled


def test_committed_default_model_matches_what_the_builder_writes():
    committed = read_config(ROOT / "model_repository" / "minilm" / "config.pbtxt")
    assert committed == model_config("minilm", "EMBEDDING", 384)
    assert (ROOT / "model_repository" / "minilm" / "1" / "model.py").read_text() == MODEL_PY
