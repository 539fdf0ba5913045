"""The family wrappers: a transformer and what runs after it, as one module whose forward takes
the graph's inputs ([B, T] int64 each) and returns the answer ([B, D] or [B, C] fp32).

Pooling and heads live inside the module, so an engine's output is the answer itself and no
per-row work is left for Python on the hot path. Every wrapper reads only real tokens (through
the attention mask, or the last real position), so right padding never changes a row's output.

The builder wraps a loaded model with them and exports that to ONNX (``builder.families``); the
torch engine runs the same classes. Its artifact is the wrapper's weights plus a record of how to
rebuild it (``save_torch_model``, ``load_torch_model``): the transformer's config and the
wrapper's own settings (pooling, Dense layers, chosen token ids). Rebuilt from the record, the
module is the code the ONNX export traced, on whatever device and precision the engine asks for,
with SDPA attention; ``torch.export``'s program would instead fix the precision, device and torch
version at build time, and need a GPU at build time for an FP16 CUDA graph.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from python_backend.common.manifest import ENGINE_FILES

# the lowest finite FP16 value: a mask fill that may run in FP16 must stay finite there
FP16_LOWEST = -65504.0
# the activations a sentence-transformers Dense module may name, by its class path
ACTIVATIONS = {
    "torch.nn.modules.linear.Identity": nn.Identity,
    "torch.nn.modules.activation.Tanh": nn.Tanh,
    "torch.nn.modules.activation.ReLU": nn.ReLU,
    "torch.nn.modules.activation.GELU": nn.GELU,
    "torch.nn.modules.activation.Sigmoid": nn.Sigmoid,
}
ACTIVATION_NAMES = {kind: name for name, kind in ACTIVATIONS.items()}

TORCH_WEIGHTS, TORCH_RECORD = ENGINE_FILES["torch"]  # in a model's version folder
RECORD_FORMAT = 1


def without_kv_cache(model: nn.Module) -> nn.Module:
    """``model`` set to keep no key/value cache: a forward here is prefill only, nothing is
    generated after it, and a decoder would otherwise build its cache in every forward (and,
    captured in a CUDA graph, keep it reserved for the life of the process)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "use_cache"):
        config.use_cache = False
    return model


class Pooling(nn.Module):
    """[B, T, H] hidden states and the mask -> [B, H] pooled, computed in FP32 whatever the
    transformer runs in: a mean sums up to T rows of hidden states, which FP16 cannot hold for
    long rows of large activations (its largest value is 65504), and BF16 rounds to 8 bits.

    Its own module, so that the exported graph names its nodes ``/pool/...`` and a TensorRT FP16
    build keeps them in FP32 (``FP32_SCOPES``)."""

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(torch.float32)  # a Cast in the exported graph, at the pooling's input
        if self.mode == "cls":
            return hidden[:, 0]
        if self.mode == "lasttoken":
            # rows are right-padded: the last real token is at mask.sum - 1
            last = attention_mask.sum(dim=1) - 1
            return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
        if self.mode == "max":
            # padding selected away, never multiplied: a constant like 1e9 is infinite in FP16
            # and 0 * inf is NaN; FP16's lowest finite value stays finite wherever it runs
            padding = (attention_mask == 0).unsqueeze(-1)  # [B, T, 1]
            return hidden.masked_fill(padding, FP16_LOWEST).max(dim=1).values
        mask = attention_mask.unsqueeze(-1).to(torch.float32)  # [B, T, 1]
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class UnitLength(nn.Module):
    """L2 normalisation in FP32 (the squares of a vector's entries overflow FP16 sooner than
    the entries do); the exported graph names its nodes ``/unit_length/...``."""

    def forward(self, vectors: torch.Tensor) -> torch.Tensor:
        return nn.functional.normalize(vectors.to(torch.float32), p=2.0, dim=-1)


# the wrapper's submodules that run in FP32 in every precision: the exported graph's nodes under
# these scopes (``/pool/...``) are the layers a TensorRT FP16 build constrains to FP32
FP32_SCOPES = ("pool", "unit_length")


class EmbeddingHead(nn.Module):
    def __init__(
        self,
        encoder: nn.Module,
        pooling: str,
        normalize: bool,
        after_pooling: list[nn.Module] | None = None,
    ) -> None:
        super().__init__()
        self.encoder = without_kv_cache(encoder)
        self.pooling = pooling
        self.normalize = normalize
        self.after_pooling = nn.Sequential(*(after_pooling or []))
        # no parameters: the saved weights of earlier builds load as they did
        self.pool = Pooling(pooling)
        self.unit_length = UnitLength()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = self.pool(hidden, attention_mask)  # FP32
        dense = next(self.after_pooling.parameters(), None)
        if dense is not None:  # the Dense layers run in the model's precision, like the encoder
            pooled = self.after_pooling(pooled.to(dense.dtype)).to(torch.float32)
        if self.normalize:
            pooled = self.unit_length(pooled)
        return pooled


class ClassifierHead(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = without_kv_cache(model)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()


class PairScorer(nn.Module):
    """A cross-encoder: the classification head's logit over (text, text pair) tokens."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = without_kv_cache(model)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
    ) -> torch.Tensor:
        return self.model(
            input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
        ).logits.float()


class LastTokenScorer(nn.Module):
    """Logits at each row's last real token (rows are right-padded), optionally chosen ids only.

    The row's last hidden state is gathered before the output projection, so a forward computes
    [B, V] logits (or [B, len(ids)] with chosen ids: only their rows of the projection), never
    [B, T, V]: at a 151k vocabulary and 64k tokens a forward that would be about 20 GB.
    """

    def __init__(self, model: nn.Module, token_ids: list[int] | None) -> None:
        super().__init__()
        without_kv_cache(model)
        self.body = getattr(model, "base_model", model)  # the decoder stack, without lm_head
        output_embeddings = getattr(model, "get_output_embeddings", None)
        head = output_embeddings() if callable(output_embeddings) else None
        if not isinstance(head, nn.Linear) or self.body is model:
            raise ValueError(
                f"{type(model).__name__}: no decoder stack with a linear output projection "
                "to gather the last token before; this decoder cannot be exported"
            )
        self.token_ids = list(token_ids or [])  # the vocabulary rows kept; [] for all of them
        self.head = head  # all logits: the model's own projection (tied weights stay shared)
        if token_ids:  # only the chosen rows of the projection
            ids = torch.tensor(token_ids, dtype=torch.long)
            self.head = nn.Linear(head.in_features, len(token_ids), bias=head.bias is not None)
            with torch.no_grad():
                self.head.weight.copy_(head.weight[ids])
                if head.bias is not None:
                    self.head.bias.copy_(head.bias[ids])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # positions 0..n-1 for the real tokens of every right-padded row: causal attention means
        # a real token never sees the padding after it
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(dim=1) - 1  # [B]
        rows = torch.arange(hidden.shape[0], device=hidden.device)
        return self.head(hidden[rows, last]).float()  # [B, H] -> [B, V or len(ids)]


class FP32Norm(nn.Module):
    """A norm computing in FP32 inside a lower-precision module: its input cast up, its output
    back (a row's mean of squares overflows FP16 long before its values do)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden.to(torch.float32)).to(hidden.dtype)


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith(
        ("RMSNorm", "LayerNorm")
    )


# a manifest's precision as torch's dtype
DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}


def in_precision(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``module`` in ``dtype`` (in place), its norms computing in FP32 (``FP32Norm``) with their
    weights never rounded through ``dtype``, and rotary frequencies (``inv_freq``) kept FP32:
    rounded to FP16 they turn positions by up to a radian at 8k tokens."""
    if dtype == torch.float32:
        return module
    for parent in list(module.modules()):
        for name, child in list(parent.named_children()):
            if is_norm(child) and not isinstance(parent, FP32Norm):
                setattr(parent, name, FP32Norm(child))
    kept = {id(t) for m in module.modules() if isinstance(m, FP32Norm) for t in m.parameters()}
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        if tensor.is_floating_point() and id(tensor) not in kept and "inv_freq" not in name:
            tensor.data = tensor.data.to(dtype)
    return module


class YesNoScorer(LastTokenScorer):
    """A decoder reranker's score: the "yes" logit less the "no" logit at the last real token,
    [B, 1]; its sigmoid is P(yes) over yes and no, the softmax of the two."""

    def __init__(self, model: nn.Module, yes_id: int, no_id: int) -> None:
        super().__init__(model, [yes_id, no_id])

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        both = super().forward(input_ids, attention_mask)  # [B, 2]: yes, no
        return both[:, :1] - both[:, 1:]


# each wrapper's record name, and the transformers auto class of the model it wraps
WRAPPERS = {
    "embedding": "AutoModel",  # EmbeddingHead
    "classifier": "AutoModelForSequenceClassification",  # ClassifierHead
    "pair_scorer": "AutoModelForSequenceClassification",  # PairScorer
    "last_token": "AutoModelForCausalLM",  # LastTokenScorer
    "yes_no": "AutoModelForCausalLM",  # YesNoScorer
}


class TorchModelError(ValueError):
    """A torch engine artifact that cannot be rebuilt (the message names what is wrong)."""


def wrapper_record(module: nn.Module) -> dict[str, Any]:
    """How to rebuild ``module``: its wrapper, the wrapped transformer's config, and the
    wrapper's own settings."""
    config: Any  # the transformer's config (a transformers PretrainedConfig)
    if isinstance(module, EmbeddingHead):
        dense = []
        for layer in module.after_pooling:
            assert isinstance(layer, nn.Sequential)  # builder.families.load_dense's shape
            linear, activation = layer
            dense.append(
                {
                    "in_features": linear.in_features,
                    "out_features": linear.out_features,
                    "bias": linear.bias is not None,
                    "activation": ACTIVATION_NAMES[type(activation)],
                }
            )
        settings: dict[str, Any] = {
            "pooling": module.pooling,
            "normalize": module.normalize,
            "dense": dense,
        }
        name, config = "embedding", module.encoder.config
    elif isinstance(module, LastTokenScorer):
        name = "yes_no" if isinstance(module, YesNoScorer) else "last_token"
        config, settings = module.body.config, {"token_ids": module.token_ids}
    elif isinstance(module, PairScorer | ClassifierHead):
        name = "pair_scorer" if isinstance(module, PairScorer) else "classifier"
        config, settings = module.model.config, {}
    else:
        raise TorchModelError(f"{type(module).__name__} is not a family wrapper")
    return {
        "format": RECORD_FORMAT,
        "wrapper": name,
        "settings": settings,
        "transformer_config": config.to_dict(),
    }


def save_torch_model(module: nn.Module, folder: Path) -> tuple[str, ...]:
    """Writes the torch engine's files into ``folder``; returns their names. Tied weights (a
    decoder's embeddings and output projection) are stored once."""
    from safetensors.torch import save_model

    record = wrapper_record(module)
    save_model(module, str(Path(folder) / TORCH_WEIGHTS))
    (Path(folder) / TORCH_WEIGHTS).chmod(0o644)  # safetensors writes it owner-only
    (Path(folder) / TORCH_RECORD).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return ENGINE_FILES["torch"]


def _transformer(auto_class: str, config: dict[str, Any]) -> nn.Module:
    """The transformer the record names, from its config (weights come after), with SDPA
    attention: PyTorch picks the attention kernel for the device and precision it runs on."""
    import transformers

    config = dict(config)
    model_type = config.pop("model_type", None)
    if not isinstance(model_type, str):
        raise TorchModelError(f"{TORCH_RECORD}: the transformer config names no model_type")
    try:
        hf_config = transformers.AutoConfig.for_model(model_type, **config)
    except ValueError as err:
        raise TorchModelError(f"{TORCH_RECORD}: {err}") from None
    auto = getattr(transformers, auto_class)
    return auto.from_config(hf_config, attn_implementation="sdpa", dtype=torch.float32)


def rebuild_wrapper(record: dict[str, Any]) -> nn.Module:
    """The module a record describes, with its transformer's weights still random."""
    if record.get("format") != RECORD_FORMAT:
        raise TorchModelError(
            f"{TORCH_RECORD}: format {record.get('format')!r}, this server reads "
            f"{RECORD_FORMAT}: rebuild the model with `python -m builder build --engine torch`"
        )
    name = record.get("wrapper")
    if name not in WRAPPERS:
        raise TorchModelError(f"{TORCH_RECORD}: unknown wrapper {name!r}; known: {list(WRAPPERS)}")
    transformer = _transformer(WRAPPERS[name], record["transformer_config"])
    settings = record.get("settings") or {}
    if name == "embedding":
        dense: list[nn.Module] = [
            nn.Sequential(
                nn.Linear(d["in_features"], d["out_features"], bias=d["bias"]),
                ACTIVATIONS[d["activation"]](),
            )
            for d in settings["dense"]
        ]
        return EmbeddingHead(transformer, settings["pooling"], settings["normalize"], dense)
    if name == "last_token":
        return LastTokenScorer(transformer, settings["token_ids"] or None)
    if name == "yes_no":
        return YesNoScorer(transformer, *settings["token_ids"])
    return PairScorer(transformer) if name == "pair_scorer" else ClassifierHead(transformer)


def load_torch_model(folder: Path, dtype: torch.dtype, device: torch.device) -> nn.Module:
    """The module saved by ``save_torch_model``, in eval mode, on ``device`` in ``dtype``."""
    from safetensors.torch import load_model

    folder = Path(folder)
    try:
        record = json.loads((folder / TORCH_RECORD).read_text())
    except (OSError, ValueError) as err:
        raise TorchModelError(f"{folder / TORCH_RECORD}: {err}") from None
    module = rebuild_wrapper(record)
    missing, unexpected = load_model(module, str(folder / TORCH_WEIGHTS), strict=False)
    # a tied weight is stored once: the one left out is the same tensor as one loaded
    if unexpected or any(not _tied(module, name) for name in missing):
        raise TorchModelError(
            f"{folder / TORCH_WEIGHTS} does not match {TORCH_RECORD}: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    return in_precision(module, dtype).to(device=device).eval()


def _tied(module: nn.Module, name: str) -> bool:
    """Whether parameter ``name`` shares its storage with another parameter of ``module``."""
    params = dict(module.named_parameters(remove_duplicate=False))
    tensor = params.get(name)
    return tensor is not None and any(
        other != name and p.data_ptr() == tensor.data_ptr() for other, p in params.items()
    )
