"""Model families: a Hugging Face model wrapped so that the exported graph returns [B, D] or [B, C].

The wrappers themselves (pooling and heads inside the graph) are
``python_backend.engines.torch_modules``, which the torch engine runs too; this module detects a
model's family and loads and wraps it.

- embedding: encoder (or a decoder, for decoder embedders) + the sentence-transformers modules
  after it, in their order: pooling (mean, CLS, max or last token), Dense layers, L2
  normalisation -> EMBEDDING [B, D]. A module that cannot be exported is refused by name, never
  skipped: skipping one would serve wrong vectors without a word.
- classifier: encoder with a sequence-classification head -> LOGITS [B, C]
- decoder: decoder-only model used for scoring; logits at each row's last real token, optionally
  only chosen token ids (e.g. yes / no) -> LOGITS [B, C]
- reranker: a cross-encoder (sequence classification with one output) over (text, text pair),
  with token_type_ids as a third graph input -> SCORE [B, 1]
- decoder_reranker: a causal LM judging (query, document) in a prompt template
  (``builder.rerank_template``): the "yes" logit less the "no" logit at the last token ->
  SCORE [B, 1]
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from python_backend.common.contract import (
    ENGINE_INPUTS,
    FAMILIES,
    FAMILY_CONTRACTS,
    TOKEN_TYPE_INPUT,
    RerankTemplate,
    split_token_types,
)
from python_backend.engines.torch_modules import (
    ACTIVATIONS,
    ClassifierHead,
    EmbeddingHead,
    LastTokenScorer,
    PairScorer,
    YesNoScorer,
)

DECODER_SUFFIXES = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class LoadedModel:
    module: nn.Module  # (input_ids [B,T] int64, attention_mask [B,T] int64) -> [B, out_dim] fp32
    family: str
    output_name: str  # the family's one output (contract.FAMILY_CONTRACTS)
    output_dim: int
    max_length: int  # the model's own limit on row length
    vocab_size: int
    pad_token_id: int
    describe: dict[str, object]  # architecture, pooling, ... for the manifest
    prompts: dict[str, str] = field(default_factory=dict)  # sentence-transformers prompts
    default_prompt_name: str | None = None
    labels: tuple[str, ...] = ()  # classifier class names, in output order (id2label)
    rerank_template: RerankTemplate | None = None  # decoder rerankers: how a pair is read
    input_names: tuple[str, ...] = ENGINE_INPUTS  # the graph's inputs (pair models: three)
    # the pipeline ends in Normalize: the server applies it (the graph returns pooled vectors)
    normalize: bool = False


# the sentence-transformers modules an exported graph reproduces, by their class name
SUPPORTED_MODULES = ("Transformer", "Pooling", "Dense", "Normalize")
POOLING_MODES = ("mean", "cls", "max", "lasttoken")


def sentence_transformers_modules(model_dir: Path) -> list[tuple[str, Path]]:
    """(class name, folder) of each module in modules.json, in order; [] without the file.
    A module type the graph cannot reproduce is refused, naming it."""
    modules_file = Path(model_dir) / "modules.json"
    if not modules_file.is_file():
        return []
    out = []
    for m in json.loads(modules_file.read_text()):
        kind = str(m.get("type", "")).rsplit(".", 1)[-1]
        if kind not in SUPPORTED_MODULES:
            raise ValueError(
                f"sentence-transformers module {m.get('type')!r} ({m.get('path') or 'root'}) "
                f"cannot be exported into the graph; supported: {', '.join(SUPPORTED_MODULES)}"
            )
        out.append((kind, Path(model_dir) / str(m.get("path", ""))))
    return out


def pooling_mode(config: dict) -> str:
    """The pooling mode of a Pooling module's config, in either format sentence-transformers
    has written (``pooling_mode``, or one ``pooling_mode_*`` flag)."""
    if config.get("include_prompt") is False:
        raise ValueError(
            "sentence-transformers pooling leaves the prompt's tokens out (include_prompt false); "
            "the exported graph pools every token, so this model is refused"
        )
    if "pooling_mode" in config:
        modes = config["pooling_mode"]
        modes = [modes] if isinstance(modes, str) else list(modes)
    else:
        flags = {
            "pooling_mode_cls_token": "cls",
            "pooling_mode_mean_tokens": "mean",
            "pooling_mode_max_tokens": "max",
            "pooling_mode_lasttoken": "lasttoken",
            "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens": "weightedmean",
        }
        modes = [mode for key, mode in flags.items() if config.get(key)]
    if len(modes) != 1 or modes[0] not in POOLING_MODES:
        raise ValueError(
            f"unsupported sentence-transformers pooling: {modes}; supported: one of "
            f"{', '.join(POOLING_MODES)}"
        )
    return str(modes[0])


def load_dense(folder: Path) -> nn.Sequential:
    """A sentence-transformers Dense module as a torch Linear + activation, from its files."""
    config = json.loads((folder / "config.json").read_text())
    if config.get("use_residual"):
        raise ValueError(f"Dense module {folder.name}: a residual Dense cannot be exported")
    activation = ACTIVATIONS.get(str(config.get("activation_function")))
    if activation is None:
        raise ValueError(
            f"Dense module {folder.name}: activation {config.get('activation_function')!r} "
            f"cannot be exported; supported: {', '.join(sorted(ACTIVATIONS))}"
        )
    linear = nn.Linear(
        int(config["in_features"]), int(config["out_features"]), bias=bool(config.get("bias", True))
    )
    if (folder / "model.safetensors").is_file():
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
    elif (folder / "pytorch_model.bin").is_file():
        state = torch.load(folder / "pytorch_model.bin", map_location="cpu", weights_only=True)
    else:
        raise ValueError(f"Dense module {folder.name}: no model.safetensors or pytorch_model.bin")
    weights = {k.removeprefix("linear."): v for k, v in state.items() if k.startswith("linear.")}
    linear.load_state_dict(weights)
    return nn.Sequential(linear, activation())


@dataclass(frozen=True)
class EmbeddingPipeline:
    """What sentence-transformers runs after the transformer, as the graph will run it."""

    pooling: str
    after_pooling: list[nn.Module]  # Dense layers, in order
    normalize: bool
    dimension: int | None  # the last Dense's width; None: the transformer's hidden size


def embedding_pipeline(model_dir: Path) -> EmbeddingPipeline:
    """The modules after the transformer; mean pooling, nothing else, without modules.json."""
    pooling, normalize = "mean", False
    after: list[nn.Module] = []
    dimension: int | None = None
    for kind, folder in sentence_transformers_modules(model_dir):
        if kind == "Pooling":
            pooling = pooling_mode(json.loads((folder / "config.json").read_text()))
        elif kind == "Dense":
            dense = load_dense(folder)
            after.append(dense)
            dimension = int(json.loads((folder / "config.json").read_text())["out_features"])
        elif kind == "Normalize":
            normalize = True
    return EmbeddingPipeline(pooling, after, normalize, dimension)


def sentence_transformers_pooling(model_dir: Path) -> tuple[str, bool]:
    """(pooling mode, normalize) of a sentence-transformers model directory."""
    pipeline = embedding_pipeline(model_dir)
    return pipeline.pooling, pipeline.normalize


def sentence_transformers_prompts(model_dir: Path) -> tuple[dict[str, str], str | None]:
    """(prompts by name, the default prompt's name) from config_sentence_transformers.json."""
    path = Path(model_dir) / "config_sentence_transformers.json"
    if not path.is_file():
        return {}, None
    config = json.loads(path.read_text())
    prompts = {str(k): str(v) for k, v in (config.get("prompts") or {}).items()}
    default = config.get("default_prompt_name")
    if default is not None and default not in prompts:
        raise ValueError(f"default_prompt_name {default!r} names no prompt of {sorted(prompts)}")
    return prompts, default


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


def check_last_token_scorer(scorer: LastTokenScorer, model: nn.Module, vocab: int) -> None:
    """The gathered head equals the model's own logits at the last token (a model that scales or
    caps its logits after lm_head would not): refused with the difference, never served."""
    ids = torch.randint(0, vocab, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=mask).logits[[0, 1], [5, 3]]  # [2, V]
        got = LastTokenScorer.forward(scorer, ids, mask)  # the gathered logits themselves
    want = full[:, scorer.token_ids] if scorer.token_ids else full
    diff = float((got - want).abs().max())
    if diff > 1e-4 * max(1.0, float(want.abs().max())):
        raise ValueError(
            f"{type(model).__name__}: logits differ from lm_head on the last hidden state by "
            f"{diff:.2e} (the model transforms its logits after lm_head); it cannot be exported"
        )


def run_rows_alone(model: LoadedModel, rows: list[np.ndarray]) -> np.ndarray:
    """The wrapped model on each row by itself, with no padding at all: [len(rows), out_dim].

    The reference every engine and every served output is checked against (each family's
    reference run). It feeds the family's graph inputs by name; rows of pair models carry their
    token types in the high bits (``split_token_types``).
    """
    outputs = []
    with torch.no_grad():
        for row in rows:
            ids, types = split_token_types(np.asarray(row)[None])
            inputs = {
                ENGINE_INPUTS[0]: torch.tensor(ids),
                ENGINE_INPUTS[1]: torch.ones((1, len(row)), dtype=torch.long),
                TOKEN_TYPE_INPUT: torch.tensor(types),
            }
            outputs.append(model.module(*(inputs[n] for n in model.input_names))[0].numpy())
    return np.stack(outputs)


def run_rows_served(model: LoadedModel, rows: list[np.ndarray]) -> np.ndarray:
    """``run_rows_alone``, then what the server does by default after the graph: an embedding
    model whose pipeline ends in Normalize answers unit vectors. The reference served outputs
    are checked against."""
    outputs = run_rows_alone(model, rows)
    if model.normalize:
        outputs = outputs / np.linalg.norm(outputs, axis=1, keepdims=True)
    return outputs


# -- the family table ---------------------------------------------------------------------------
# A family is one record: how it is detected, how the model is wrapped (module, output size and
# what the manifest records), and, from the contract, its output name and graph inputs. Its
# reference run is ``run_rows_alone`` over those inputs. Adding a family is one record and its
# wrapper (and its line in ``contract.FAMILY_CONTRACTS``).


@dataclass(frozen=True)
class Wrapped:
    """A model wrapped for its family: what differs between families after loading."""

    module: nn.Module  # graph inputs [B, T] int64 each -> [B, output_dim] fp32
    output_dim: int
    describe: dict[str, object] = field(default_factory=dict)  # for the manifest
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    labels: tuple[str, ...] = ()


# what a family's wrapper is given: (model dir, transformers config, --score-token-ids)
Wrapper = Callable[[Path, Any, list[int] | None], Wrapped]
# (model dir, config.json as a dict) -> whether the model is of this family
Detector = Callable[[Path, dict[str, Any]], bool]

LOAD_KWARGS: dict[str, Any] = {"attn_implementation": "eager", "dtype": torch.float32}


@dataclass(frozen=True)
class Family:
    name: str  # a key of contract.FAMILY_CONTRACTS
    detects: Detector
    wrap: Wrapper
    takes_score_token_ids: bool = False

    @property
    def output_name(self) -> str:
        return FAMILY_CONTRACTS[self.name].output_name

    @property
    def input_names(self) -> tuple[str, ...]:
        return FAMILY_CONTRACTS[self.name].input_names


def _architectures(config: dict[str, Any]) -> list[str]:
    return list(config.get("architectures") or [])


def _has_pooling_module(model_dir: Path, config: dict[str, Any]) -> bool:
    """sentence-transformers pools it (decoder embedders too: their config names *ForCausalLM)."""
    return any(kind == "Pooling" for kind, _ in sentence_transformers_modules(model_dir))


def _is_sequence_classifier(model_dir: Path, config: dict[str, Any]) -> bool:
    return any(a.endswith("ForSequenceClassification") for a in _architectures(config))


def _is_single_score_classifier(model_dir: Path, config: dict[str, Any]) -> bool:
    """One output: a relevance score over a pair (how cross-encoders are saved)."""
    labels = config.get("id2label") or {}
    single = len(labels) == 1 or config.get("num_labels") == 1
    return _is_sequence_classifier(model_dir, config) and single


def _is_causal_lm(model_dir: Path, config: dict[str, Any]) -> bool:
    causal = any(a.endswith(DECODER_SUFFIXES) for a in _architectures(config))
    return causal or bool(config.get("is_decoder"))


def _decoder_model_type(model_type: str) -> bool:
    """A model type transformers builds as a causal LM and never as a masked LM: Llama, Qwen2,
    Qwen3, Mistral, Gemma, GPT-2, ... (BERT, RoBERTa and kin have both heads)."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    return (
        model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        and model_type not in MODEL_FOR_MASKED_LM_MAPPING_NAMES
    )


def decoder_architecture(model_dir: Path) -> bool:
    """The model is a decoder, whatever family it is built as: detected as a causal LM (its
    architectures, or ``is_decoder``), or a decoder model type under another head (a Qwen2 or
    Llama sequence classifier, a decoder embedder). Its activations overflow FP16: the build's
    default precision follows (``builder.precision``)."""
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return _is_causal_lm(model_dir, config) or _decoder_model_type(str(config.get("model_type")))


def wrap_embedding(model_dir: Path, config: Any, score_token_ids: list[int] | None) -> Wrapped:
    from transformers import AutoModel

    pipeline = embedding_pipeline(model_dir)
    prompts, default_prompt = sentence_transformers_prompts(model_dir)
    # Normalize stays out of the graph: the server applies it, unless a request says otherwise
    module = EmbeddingHead(
        AutoModel.from_pretrained(model_dir, **LOAD_KWARGS),
        pipeline.pooling,
        False,
        pipeline.after_pooling,
    )
    describe = {
        "pooling": pipeline.pooling,
        "dense_layers": len(pipeline.after_pooling),
        "normalize": pipeline.normalize,
    }
    dimension = pipeline.dimension or int(config.hidden_size)
    return Wrapped(module, dimension, describe, prompts, default_prompt)


def wrap_classifier(model_dir: Path, config: Any, score_token_ids: list[int] | None) -> Wrapped:
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(model_dir, **LOAD_KWARGS)
    return Wrapped(ClassifierHead(model), int(config.num_labels), labels=labels_of(config))


def wrap_reranker(model_dir: Path, config: Any, score_token_ids: list[int] | None) -> Wrapped:
    from transformers import AutoModelForSequenceClassification

    if int(config.num_labels) != 1:
        raise ValueError(
            f"a reranker scores with one output; this model has {config.num_labels} labels "
            "(build it as --family classifier)"
        )
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, **LOAD_KWARGS)
    return Wrapped(PairScorer(model), 1)


def wrap_decoder(model_dir: Path, config: Any, score_token_ids: list[int] | None) -> Wrapped:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, **LOAD_KWARGS)
    vocab = int(config.vocab_size)
    for t in score_token_ids or []:
        if not 0 <= t < vocab:
            raise ValueError(f"--score-token-ids: {t} is outside the vocabulary [0, {vocab})")
    module = LastTokenScorer(model, score_token_ids)
    check_last_token_scorer(module, model.eval(), vocab)
    out_dim = len(score_token_ids) if score_token_ids else vocab
    return Wrapped(module, out_dim, {"score_token_ids": list(score_token_ids or [])})


def wrap_decoder_reranker(
    model_dir: Path, config: Any, score_token_ids: list[int] | None
) -> Wrapped:
    """``score_token_ids``: the template's yes and no tokens (``load_model`` resolves them)."""
    from transformers import AutoModelForCausalLM

    assert score_token_ids is not None and len(score_token_ids) == 2
    model = AutoModelForCausalLM.from_pretrained(model_dir, **LOAD_KWARGS)
    module = YesNoScorer(model, *score_token_ids)
    check_last_token_scorer(module, model.eval(), int(config.vocab_size))
    return Wrapped(module, 1, {"yes_no_ids": list(score_token_ids)})


def _never(model_dir: Path, config: dict[str, Any]) -> bool:
    return False  # built when asked for (--family, or --rerank-template on a causal LM)


# detection takes the first record whose test holds, in this order (an embedding model's pooling
# module wins over its architecture; a single-score classifier is a reranker), and the fallback
# when none does: a bare encoder, mean-pooled
FAMILY_TABLE: tuple[Family, ...] = (
    Family("embedding", _has_pooling_module, wrap_embedding),
    Family("reranker", _is_single_score_classifier, wrap_reranker),
    Family("classifier", _is_sequence_classifier, wrap_classifier),
    Family("decoder", _is_causal_lm, wrap_decoder, takes_score_token_ids=True),
    Family("decoder_reranker", _never, wrap_decoder_reranker),
)
FALLBACK_FAMILY = "embedding"
FAMILY_BY_NAME = {family.name: family for family in FAMILY_TABLE}


def detect_family(model_dir: Path) -> str:
    """The first family of ``FAMILY_TABLE`` whose test holds; ``FALLBACK_FAMILY`` otherwise."""
    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text())
    for family in FAMILY_TABLE:
        if family.detects(model_dir, config):
            return family.name
    return FALLBACK_FAMILY


def load_model(
    model_dir: Path,
    family: str = "auto",
    score_token_ids: list[int] | None = None,
    rerank_template: dict[str, str] | None = None,
) -> LoadedModel:
    """Loads a local Hugging Face model directory (no network) wrapped for its family;
    ``rerank_template``: ``--rerank-template``'s settings, which make a causal LM a decoder
    reranker (``builder.rerank_template``)."""
    from transformers import AutoConfig

    from builder.rerank_template import resolve

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ValueError(f"--model-dir {model_dir} has no config.json: not a Hugging Face model")
    name = detect_family(model_dir) if family == "auto" else family
    if name == "decoder" and rerank_template is not None and family == "auto":
        name = "decoder_reranker"
    if name not in FAMILY_BY_NAME:
        raise ValueError(f"--family must be one of {FAMILIES} or auto, got {name!r}")
    record = FAMILY_BY_NAME[name]
    if score_token_ids and not record.takes_score_token_ids:
        takers = [f.name for f in FAMILY_TABLE if f.takes_score_token_ids]
        raise ValueError(f"--score-token-ids applies to {' and '.join(takers)} models only")
    if rerank_template is not None and name != "decoder_reranker":
        raise ValueError(
            f"--rerank-template builds a decoder reranker (--family decoder_reranker or auto); "
            f"this build is of the {name} family"
        )
    template = None
    if name == "decoder_reranker":
        if not decoder_architecture(model_dir):
            raise ValueError("--family decoder_reranker takes a causal LM (a decoder)")
        template = resolve(model_dir, rerank_template or {})
        score_token_ids = [template.yes_id, template.no_id]
    config = AutoConfig.from_pretrained(model_dir)
    wrapped = record.wrap(model_dir, config, score_token_ids)
    wrapped.module.eval()
    pad = getattr(config, "pad_token_id", None)
    return LoadedModel(
        module=wrapped.module,
        family=name,
        output_name=record.output_name,
        output_dim=wrapped.output_dim,
        max_length=model_max_length(model_dir, config),
        vocab_size=int(config.vocab_size),
        pad_token_id=int(pad) if pad is not None else 0,
        describe={"architecture": (config.architectures or ["?"])[0], **wrapped.describe},
        prompts=wrapped.prompts,
        default_prompt_name=wrapped.default_prompt_name,
        labels=wrapped.labels,
        input_names=record.input_names,
        normalize=bool(wrapped.describe.get("normalize", False)),
        rerank_template=template,
    )


def labels_of(config: object) -> tuple[str, ...]:
    """Class names in output order, where the model names its classes (not LABEL_0, ...)."""
    id2label = getattr(config, "id2label", None) or {}
    labels = tuple(str(id2label[i]) for i in sorted(int(k) for k in id2label))
    if not labels or all(label == f"LABEL_{i}" for i, label in enumerate(labels)):
        return ()
    return labels
