"""Small random models built from configs with a fixed seed: every code path of the real
architectures in seconds. The builder's tests and ``builder.gpu_check`` use them for the
classifier and decoder families; the end-to-end tests serve a tiny embedding model where only the
adapter's handling of a large request is their subject (the embedding family has the real MiniLM)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

VOCAB = 30522  # they share MiniLM's tokenizer
# two layers of width 32: seconds to export, yet every layer kind of the real architectures
TINY: dict[str, Any] = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=64,
    max_position_embeddings=128,
)


def save_tiny_model(family: str, folder: Path, tokenizer_json: Path, seed: int = 0) -> Path:
    """A tiny ``embedding`` model (a bare BERT encoder), ``classifier`` (BERT; 3 labels named
    negative, neutral, positive), ``reranker`` (a BERT cross-encoder: one output over a text
    pair) or ``decoder`` (Llama) saved into ``folder``."""
    import torch
    import transformers

    torch.manual_seed(seed)
    model: Any
    if family == "embedding":  # no modules.json: mean pooling, as the builder reads a bare encoder
        model = transformers.BertModel(transformers.BertConfig(**TINY, architectures=["BertModel"]))
        model = model.eval()
    elif family == "classifier":
        bert = transformers.BertConfig(
            **TINY,
            id2label={0: "negative", 1: "neutral", 2: "positive"},
            architectures=["BertForSequenceClassification"],
        )
        model = transformers.BertForSequenceClassification(bert).eval()
    elif family == "reranker":
        cross = transformers.BertConfig(
            **TINY,
            type_vocab_size=2,
            id2label={0: "LABEL_0"},
            architectures=["BertForSequenceClassification"],
        )
        model = transformers.BertForSequenceClassification(cross).eval()
    elif family == "decoder":
        llama = transformers.LlamaConfig(
            **TINY, num_key_value_heads=2, architectures=["LlamaForCausalLM"], pad_token_id=0
        )
        model = transformers.LlamaForCausalLM(llama).eval()
    else:
        raise ValueError(f"no tiny model for the {family!r} family")
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    # the tokenizer's files, so that transformers' own tokenizer loads from the folder too
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        source = tokenizer_json.parent / name
        if source.is_file():
            shutil.copyfile(source, folder / name)
    return folder
