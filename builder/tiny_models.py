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


# a chat template of Qwen's form, enough for a decoder reranker's prompt (builder.rerank_template)
CHAT_TEMPLATE = (
    "{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]


def save_tiny_decoder_reranker(folder: Path, seed: int = 0) -> Path:
    """A tiny Qwen3 causal LM with a byte-level BPE tokenizer of its own (trained here on a few
    lines: no Qwen tokenizer is available offline) holding Qwen's chat tokens, "yes" and "no"
    as single tokens, and a chat template of Qwen's form: a decoder reranker's whole recipe."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    words = (
        "Judge whether the Document meets the requirements based on the Query and the Instruct "
        "provided. Note that the answer can only be yes or no. Given a web search query, "
        "retrieve relevant passages that answer the query. system user assistant Instruct "
        "Query Document how does the planner group rows by length into buckets"
    )
    corpus = [words, "yes", "no", "yes no", "no yes"] * 50
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus, trainer)
    for word in ("yes", "no"):
        assert tokenizer.token_to_id(word) is not None, word
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=256,
    )
    fast.chat_template = CHAT_TEMPLATE
    model = tiny_transformer(
        "decoder_reranker",
        seed,
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=256,
        pad_token_id=tokenizer.token_to_id("<|endoftext|>"),
    )
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    fast.save_pretrained(folder)
    return folder


def tiny_transformer(family: str, seed: int = 0, **config: Any) -> Any:
    """The tiny transformer of a family, in eval mode: ``embedding`` (a bare BERT encoder),
    ``classifier`` (BERT; 3 labels named negative, neutral, positive), ``reranker`` (a BERT
    cross-encoder: one output over a text pair), ``decoder`` (Llama) or ``decoder_reranker``
    (Qwen3); ``config`` overrides its config's values."""
    import torch
    import transformers

    torch.manual_seed(seed)
    shape = {**TINY, **config}
    if family == "embedding":  # no modules.json: mean pooling, as the builder reads a bare encoder
        return transformers.BertModel(
            transformers.BertConfig(**shape, architectures=["BertModel"])
        ).eval()
    if family in ("classifier", "reranker"):
        labels = ("negative", "neutral", "positive") if family == "classifier" else ("LABEL_0",)
        bert = transformers.BertConfig(
            **shape,
            id2label=dict(enumerate(labels)),
            architectures=["BertForSequenceClassification"],
        )
        return transformers.BertForSequenceClassification(bert).eval()
    shape = {"pad_token_id": 0, **shape}
    if family == "decoder":
        llama = transformers.LlamaConfig(
            **shape, num_key_value_heads=2, architectures=["LlamaForCausalLM"]
        )
        return transformers.LlamaForCausalLM(llama).eval()
    if family == "decoder_reranker":
        qwen = transformers.Qwen3Config(
            **shape, num_key_value_heads=1, head_dim=16, architectures=["Qwen3ForCausalLM"]
        )
        return transformers.Qwen3ForCausalLM(qwen).eval()
    raise ValueError(f"no tiny model for the {family!r} family")


def save_tiny_model(family: str, folder: Path, tokenizer_json: Path, seed: int = 0) -> Path:
    """The family's tiny transformer (``tiny_transformer``) saved into ``folder``, with the
    tokenizer's files beside it."""
    model = tiny_transformer(family, seed)
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    # the tokenizer's files, so that transformers' own tokenizer loads from the folder too
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):
        source = tokenizer_json.parent / name
        if source.is_file():
            shutil.copyfile(source, folder / name)
    return folder
