"""Model families: a Hugging Face model wrapped so that the exported graph returns [B, D] or [B, C].

Pooling and heads live inside the graph, so an engine's output is the answer itself and no
per-row work is left for Python on the hot path. Every wrapper reads only real tokens (through
the attention mask, or the last real position), so right padding never changes a row's output.

- embedding: encoder + pooling from the sentence-transformers config (mean or CLS) + optional L2
  normalisation -> EMBEDDING [B, D]
- classifier: encoder with a sequence-classification head -> LOGITS [B, C]
- decoder: decoder-only model used for scoring; logits at each row's last real token, optionally
  only chosen token ids (e.g. yes / no) -> LOGITS [B, C]
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from python_backend.contract import FAMILIES, FAMILY_OUTPUTS

DECODER_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class LoadedModel:
    module: nn.Module  # (input_ids [B,T] int64, attention_mask [B,T] int64) -> [B, out_dim] fp32
    family: str
    output_name: str  # EMBEDDING or LOGITS
    output_dim: int
    max_length: int  # the model's own limit on row length
    vocab_size: int
    pad_token_id: int
    describe: dict[str, object]  # architecture, pooling, ... for the manifest


def detect_family(model_dir: Path) -> str:
    """classifier / decoder from the config's architectures; embedding otherwise."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    architectures = config.get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        return "classifier"
    if any(a.endswith(DECODER_SUFFIXES) for a in architectures) or config.get("is_decoder"):
        return "decoder"
    return "embedding"


def sentence_transformers_pooling(model_dir: Path) -> tuple[str, bool]:
    """(pooling mode, normalize) from modules.json and the pooling config; mean, no norm if absent."""
    model_dir = Path(model_dir)
    modules_file = model_dir / "modules.json"
    if not modules_file.is_file():
        return "mean", False
    modules = json.loads(modules_file.read_text())
    normalize = any(m.get("type", "").endswith(".Normalize") for m in modules)
    mode = "mean"
    for m in modules:
        if m.get("type", "").endswith(".Pooling"):
            pooling = json.loads((model_dir / m["path"] / "config.json").read_text())
            if pooling.get("pooling_mode_cls_token"):
                mode = "cls"
            elif pooling.get("pooling_mode_mean_tokens"):
                mode = "mean"
            else:
                chosen = [k for k, v in pooling.items() if k.startswith("pooling_mode") and v]
                raise ValueError(f"unsupported sentence-transformers pooling: {chosen}")
    return mode, normalize


def model_max_length(model_dir: Path, config: object) -> int:
    """sentence-transformers' max_seq_length when present, else the model's positions."""
    st_config = Path(model_dir) / "sentence_bert_config.json"
    if st_config.is_file():
        value = json.loads(st_config.read_text()).get("max_seq_length")
        if value:
            return int(value)
    for attr in ("max_position_embeddings", "n_positions"):
        value = getattr(config, attr, None)
        if value:
            return int(value)
    return 512


class EmbeddingHead(nn.Module):
    def __init__(self, encoder: nn.Module, pooling: str, normalize: bool) -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling
        self.normalize = normalize

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # [B, T, 1]
            pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2.0, dim=-1)
        return pooled.float()


class ClassifierHead(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()


class LastTokenScorer(nn.Module):
    """Logits at each row's last real token (rows are right-padded), optionally chosen ids only."""

    def __init__(self, model: nn.Module, token_ids: list[int] | None) -> None:
        super().__init__()
        self.model = model
        ids = torch.tensor(token_ids if token_ids else [], dtype=torch.long)
        self.register_buffer("token_ids", ids, persistent=False)
        self.select = bool(token_ids)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # positions 0..n-1 for the real tokens of every right-padded row: causal attention means
        # a real token never sees the padding after it
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask).logits  # [B,T,V]
        last = attention_mask.sum(dim=1) - 1  # [B]
        rows = torch.arange(logits.shape[0], device=logits.device)
        picked = logits[rows, last]  # [B, V]
        if self.select:
            picked = picked.index_select(1, self.token_ids)
        return picked.float()


def run_rows_alone(module: nn.Module, rows: list[np.ndarray]) -> np.ndarray:
    """The wrapped model on each row by itself, with no padding at all: [len(rows), out_dim].

    The reference every engine and every served output is checked against.
    """
    with torch.no_grad():
        return np.stack(
            [
                module(torch.tensor(r)[None], torch.ones((1, len(r)), dtype=torch.long))[0].numpy()
                for r in rows
            ]
        )


def load_model(
    model_dir: Path, family: str = "auto", score_token_ids: list[int] | None = None
) -> LoadedModel:
    """Loads a local Hugging Face model directory (no network) wrapped for its family."""
    from transformers import (
        AutoConfig,
        AutoModel,
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
    )

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model-dir {model_dir} has no config.json: not a Hugging Face model")
    family = detect_family(model_dir) if family == "auto" else family
    if family not in FAMILIES:
        raise ValueError(f"--family must be one of {FAMILIES} or auto, got {family!r}")
    if score_token_ids and family != "decoder":
        raise ValueError("--score-token-ids applies to decoder models only")
    config = AutoConfig.from_pretrained(model_dir)
    kwargs = {"attn_implementation": "eager", "dtype": torch.float32}
    describe: dict[str, object] = {"architecture": (config.architectures or ["?"])[0]}
    module: nn.Module
    if family == "embedding":
        pooling, normalize = sentence_transformers_pooling(model_dir)
        module = EmbeddingHead(AutoModel.from_pretrained(model_dir, **kwargs), pooling, normalize)
        out_dim = int(config.hidden_size)
        describe |= {"pooling": pooling, "normalize": normalize}
    elif family == "classifier":
        module = ClassifierHead(
            AutoModelForSequenceClassification.from_pretrained(model_dir, **kwargs)
        )
        out_dim = int(config.num_labels)
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, **kwargs)
        vocab = int(config.vocab_size)
        for t in score_token_ids or []:
            if not 0 <= t < vocab:
                raise ValueError(f"--score-token-ids: {t} is outside the vocabulary [0, {vocab})")
        module = LastTokenScorer(model, score_token_ids)
        out_dim = len(score_token_ids) if score_token_ids else vocab
        describe |= {"score_token_ids": list(score_token_ids or [])}
    module.eval()
    pad = getattr(config, "pad_token_id", None)
    return LoadedModel(
        module=module,
        family=family,
        output_name=FAMILY_OUTPUTS[family],
        output_dim=out_dim,
        max_length=model_max_length(model_dir, config),
        vocab_size=int(config.vocab_size),
        pad_token_id=int(pad) if pad is not None else 0,
        describe=describe,
    )
