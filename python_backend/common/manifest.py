"""The manifest: one versioned JSON file in a model's version folder, read by builder and server.

It says what the engine files are and how to run them: the model family and its output, the
tokenizer and the max length, the length buckets with their batch ranges, the graph's input
names, the cost model the planner uses, the engine kind, its files and precision. The engine's
optimization profiles (``engine_profiles``) are derived from the buckets once and written beside
them, for the reader; loading derives them again and refuses a file whose profiles differ.
Loading validates every field and names the one that is wrong, so a bad build fails at model
load with a message, not later mid-request.

Format 1 (before the input names and profiles were written) is still read: its ``pair_input``
flag names the token-type input. A manifest without ``device`` (written before a torch build
could run FP32 or BF16 on a GPU) runs where its engine kind and precision said then: TensorRT on
a GPU, torch on a GPU where FP16, everything else on the CPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from python_backend.common.contract import (
    ENGINE_INPUTS,
    FAMILIES,
    FAMILY_CONTRACTS,
    FAMILY_OUTPUTS,
    TOKEN_TYPE_INPUT,
    RerankTemplate,
)
from python_backend.common.cost_models import (
    CostModel,
    StoredCost,
    cost_model_from_dict,
    cost_model_to_dict,
)
from python_backend.common.engine_profiles import Bucket, EngineProfiles, LongRows, engine_profiles

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)
# each engine kind's files in the version folder
ENGINE_FILES: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("model.onnx",),
    "tensorrt": ("model.plan",),
    "torch": ("torch_model.safetensors", "torch_model.json"),  # weights, how to rebuild
}
ENGINE_KINDS = tuple(ENGINE_FILES)
PRECISIONS = ("fp32", "fp16", "bf16")
DEVICES = ("gpu", "cpu")
# the precisions each engine kind runs (bf16: the torch engine on a GPU with BF16)
ENGINE_PRECISIONS: dict[str, tuple[str, ...]] = {
    "onnxruntime": ("fp32",),
    "tensorrt": ("fp32", "fp16"),
    "torch": PRECISIONS,
}


class ManifestError(ValueError):
    """A manifest that is missing, unreadable or has a wrong field (the message names it)."""


@dataclass(frozen=True)
class Manifest:
    model_name: str
    family: str  # a name in contract.FAMILIES
    output_name: str  # the family's one output (contract.FAMILY_CONTRACTS)
    output_dim: int  # D or C: the engine returns [B, output_dim]
    tokenizer_file: str  # tokenizer.json beside the manifest
    max_length: int  # longest row the engine accepts, in tokens
    vocab_size: int  # token ids must lie in [0, vocab_size)
    pad_token_id: int
    buckets: tuple[Bucket, ...]  # ascending lengths
    max_batch: int  # the server's cap on rows per forward
    engine_kind: str  # onnxruntime | tensorrt | torch
    engine_files: tuple[str, ...]  # relative to the version folder
    precision: str  # fp32 | fp16 | bf16 (ENGINE_PRECISIONS: which engine runs which)
    cost_model: StoredCost  # the planner's cost model, parsed once (stored as a dict)
    long_rows: LongRows | None = None  # None: rows above the last bucket are truncated or refused
    # the TensorRT version that serialized the plan ("" for ONNX Runtime): a plan loads only in it
    engine_version: str = ""
    # sentence-transformers prompts by name, prepended to text input on request (prompt_name);
    # the default one applies when a request names none
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    labels: tuple[str, ...] = ()  # classifier class names in output order (id2label); () if none
    # how each profile's opt batch was chosen (builder.opt_shapes): method, queue, cost
    opt_rows_source: dict[str, Any] = field(default_factory=dict)
    # the graph's inputs, in order ([B, T] int64 each): a family with token types has three
    input_names: tuple[str, ...] = ENGINE_INPUTS
    # embedding models whose pipeline ends in Normalize: the server scales each vector to unit
    # length unless a request says otherwise (parameter normalize); the graph returns the pooled
    # vector itself. Builds before format 3 normalised inside the graph (graph_normalizes)
    normalize: bool = False
    graph_normalizes: bool = False
    # embedding models: each dimension's (min, max) over the served vectors of the builder's text
    # sample, for int8 and uint8 vectors (sentence-transformers' scalar quantization ranges)
    quantization_ranges: tuple[tuple[float, ...], tuple[float, ...]] | None = None
    # those served vectors themselves ([rows, D] float32 .npy beside the manifest): the ranges of
    # any shortened size (Matryoshka dimensions) are taken over them
    quantization_sample: str | None = None
    calibration: dict[str, Any] = field(default_factory=dict)  # what was timed, and the fit
    source: dict[str, Any] = field(default_factory=dict)  # where the model came from
    # where the engine runs: gpu | cpu; None (manifests written before it): as runs_on_gpu derives
    device: str | None = None
    # decoder rerankers: how a (query, document) pair becomes one row
    rerank_template: RerankTemplate | None = None
    format_version: int = FORMAT_VERSION

    @property
    def last_bucket(self) -> int:
        return self.buckets[-1].length

    @property
    def runs_on_gpu(self) -> bool:
        """Where the engine runs: the manifest's ``device``; without one (manifests written
        before it), a TensorRT plan on a GPU, a torch build on one where it is FP16 (or BF16) and
        on the CPU where it is FP32, ONNX Runtime on the CPU."""
        if self.device is not None:
            return self.device == "gpu"
        return self.engine_kind == "tensorrt" or (
            self.engine_kind == "torch" and self.precision != "fp32"
        )

    @property
    def takes_pairs(self) -> bool:
        """The graph reads each token's type (cross-encoders: their rows are pairs)."""
        return TOKEN_TYPE_INPUT in self.input_names

    @property
    def text_pairs(self) -> bool:
        """Takes TEXT with TEXT_PAIR: a cross-encoder, or a decoder reranker's template."""
        return self.takes_pairs or self.rerank_template is not None

    @cached_property
    def engine_profiles(self) -> EngineProfiles:
        """The engine's profiles, in order: the one value builder and runtimes read."""
        return engine_profiles(self.buckets, self.long_rows, self.max_length, self.input_names)

    def planner_cost(self) -> CostModel:
        return self.cost_model

    def to_json(self) -> str:
        data = asdict(self)
        data["cost_model"] = cost_model_to_dict(self.cost_model)
        data["engine_profiles"] = self.engine_profiles.to_dict()  # derived, for the reader
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def write(self, version_dir: Path) -> Path:
        path = Path(version_dir) / MANIFEST_FILE
        path.write_text(self.to_json())
        return path


def _require(data: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str = "") -> Any:
    name = f"{where}{key}"
    if key not in data:
        raise ManifestError(f"manifest field '{name}' is missing")
    value = data[key]
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ManifestError(f"manifest field '{name}' has the wrong type: {value!r}")
    if not isinstance(value, kind):
        raise ManifestError(f"manifest field '{name}' has the wrong type: {value!r}")
    return value


def _positive(data: dict[str, Any], key: str, where: str = "") -> int:
    value = _require(data, key, int, where)
    if value < 1:
        raise ManifestError(f"manifest field '{where}{key}' must be >= 1, got {value}")
    return int(value)


def _choice(data: dict[str, Any], key: str, choices: tuple[str, ...]) -> str:
    value = _require(data, key, str)
    if value not in choices:
        raise ManifestError(f"manifest field '{key}' must be one of {list(choices)}, got {value!r}")
    return str(value)


def bucket_from_dict(data: Any, i: int) -> Bucket:
    """One entry of a manifest's `buckets`, validated (``i``: its index, for the message)."""
    where = f"buckets[{i}]."
    if not isinstance(data, dict):
        raise ManifestError(f"manifest field 'buckets[{i}]' must be an object")
    length = _positive(data, "length", where)
    max_rows = _positive(data, "max_rows", where)
    opt_rows = _positive(data, "opt_rows", where)
    if opt_rows > max_rows:
        raise ManifestError(f"manifest field '{where}opt_rows' exceeds max_rows ({max_rows})")
    captured = tuple(int(x) for x in data.get("captured_batch_sizes", ()))
    if captured and (
        list(captured) != sorted(set(captured)) or captured[0] < 1 or captured[-1] != max_rows
    ):
        raise ManifestError(
            f"manifest field '{where}captured_batch_sizes' must ascend from >= 1 to max_rows"
        )
    return Bucket(length, max_rows, opt_rows, captured)


def manifest_from_dict(data: Any) -> Manifest:
    """Validates and builds a Manifest; a ManifestError names the first bad field."""
    if not isinstance(data, dict):
        raise ManifestError("manifest must be a JSON object")
    version = _require(data, "format_version", int)
    if version not in READABLE_FORMATS:
        raise ManifestError(
            f"manifest field 'format_version' is {version}; this server reads "
            f"{', '.join(map(str, READABLE_FORMATS))}: rebuild the model with "
            "`python -m builder build`"
        )
    family = _choice(data, "family", FAMILIES)
    output_name = _require(data, "output_name", str)
    if output_name != FAMILY_OUTPUTS[family]:
        raise ManifestError(
            f"manifest field 'output_name' must be {FAMILY_OUTPUTS[family]} for {family}"
        )
    raw_buckets = _require(data, "buckets", list)
    if not raw_buckets:
        raise ManifestError("manifest field 'buckets' must not be empty")
    buckets = tuple(bucket_from_dict(b, i) for i, b in enumerate(raw_buckets))
    lengths = [b.length for b in buckets]
    if lengths != sorted(set(lengths)):
        raise ManifestError("manifest field 'buckets' must have distinct ascending lengths")
    max_length = _positive(data, "max_length")
    if lengths[-1] > max_length:
        raise ManifestError("manifest field 'max_length' is below the last bucket's length")
    long_rows = None
    if data.get("long_rows") is not None:
        raw = _require(data, "long_rows", dict)
        max_rows = _positive(raw, "max_rows", "long_rows.")
        # manifests written before opt_rows was chosen tuned at half the max rows
        opt_rows = _positive(raw, "opt_rows", "long_rows.") if "opt_rows" in raw else None
        long_rows = LongRows(
            max_rows,
            _positive(raw, "opt_length", "long_rows."),
            opt_rows or max(1, max_rows // 2),
        )
        if long_rows.opt_rows > max_rows:
            raise ManifestError("manifest field 'long_rows.opt_rows' exceeds max_rows")
        if lengths[-1] == max_length:
            raise ManifestError(
                "manifest field 'long_rows' is set but no length is above the last bucket"
            )
    engine_files = _require(data, "engine_files", list)
    if not engine_files or not all(isinstance(f, str) and f for f in engine_files):
        raise ManifestError("manifest field 'engine_files' must list file names")
    try:
        cost = cost_model_from_dict(_require(data, "cost_model", dict))
    except (KeyError, TypeError, ValueError) as err:
        raise ManifestError(f"manifest field 'cost_model' is invalid: {err}") from None
    engine_kind = _choice(data, "engine_kind", ENGINE_KINDS)
    engine_version = data.get("engine_version", "")
    if not isinstance(engine_version, str):
        raise ManifestError(
            f"manifest field 'engine_version' has the wrong type: {engine_version!r}"
        )
    if engine_kind == "tensorrt" and not engine_version:
        raise ManifestError(
            "manifest field 'engine_version' is missing: a TensorRT plan must record the "
            "TensorRT version that built it (rebuild the model)"
        )
    prompts = data.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()
    ):
        raise ManifestError("manifest field 'prompts' must map prompt names to strings")
    default_prompt = data.get("default_prompt_name")
    if default_prompt is not None and default_prompt not in prompts:
        raise ManifestError(
            f"manifest field 'default_prompt_name' names no prompt: {default_prompt!r}"
        )
    labels = data.get("labels") or []
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise ManifestError("manifest field 'labels' must list class names")
    input_names = _input_names(data, version, family)
    precision = _choice(data, "precision", PRECISIONS)
    if precision not in ENGINE_PRECISIONS[engine_kind]:
        raise ManifestError(
            f"manifest field 'precision' is {precision}; {engine_kind} engines run "
            f"{', '.join(ENGINE_PRECISIONS[engine_kind])}: rebuild the model"
        )
    device = _device(data, engine_kind, precision)
    source = dict(data.get("source") or {})
    if version < 3:  # Normalize was inside the graph, as the pipeline said (source)
        normalize = graph_normalizes = family == "embedding" and bool(source.get("normalize"))
    else:
        normalize = _require(data, "normalize", bool)
        graph_normalizes = bool(data.get("graph_normalizes", False))
    if normalize and family != "embedding":
        raise ManifestError("manifest field 'normalize' is for embedding models only")
    ranges = data.get("quantization_ranges")
    if ranges is not None:
        if (
            not isinstance(ranges, list)
            or len(ranges) != 2
            or not all(isinstance(r, list) and len(r) == data.get("output_dim") for r in ranges)
            or not all(isinstance(x, int | float) for r in ranges for x in r)
        ):
            raise ManifestError(
                "manifest field 'quantization_ranges' must be two lists (min, max) of output_dim "
                "numbers"
            )
        ranges = (tuple(float(x) for x in ranges[0]), tuple(float(x) for x in ranges[1]))
    template = _rerank_template(data, family, _positive(data, "vocab_size"))
    manifest = Manifest(
        model_name=_require(data, "model_name", str),
        family=family,
        output_name=output_name,
        output_dim=_positive(data, "output_dim"),
        tokenizer_file=_require(data, "tokenizer_file", str),
        max_length=max_length,
        vocab_size=_positive(data, "vocab_size"),
        pad_token_id=_require(data, "pad_token_id", int),
        buckets=buckets,
        max_batch=_positive(data, "max_batch"),
        engine_kind=engine_kind,
        engine_version=engine_version,
        prompts=dict(prompts),
        default_prompt_name=default_prompt,
        labels=tuple(labels),
        input_names=input_names,
        engine_files=tuple(engine_files),
        precision=precision,
        cost_model=cost,
        long_rows=long_rows,
        opt_rows_source=dict(data.get("opt_rows_source") or {}),
        calibration=dict(data.get("calibration") or {}),
        source=source,
        device=device,
        normalize=normalize,
        graph_normalizes=graph_normalizes,
        quantization_ranges=ranges,
        quantization_sample=_optional_file(data, "quantization_sample"),
        rerank_template=template,
        format_version=FORMAT_VERSION,
    )
    written = data.get("engine_profiles")
    if version >= 2 and written != manifest.engine_profiles.to_dict():
        raise ManifestError(
            "manifest field 'engine_profiles' is not what its buckets derive (written by another "
            "builder, or edited): rebuild the model with `python -m builder build`"
        )
    return manifest


def _device(data: dict[str, Any], engine_kind: str, precision: str) -> str | None:
    """Where the engine runs, where the manifest says (None where it was written before)."""
    if data.get("device") is None:
        return None
    device = _choice(data, "device", DEVICES)
    if device == "gpu" and engine_kind == "onnxruntime":
        raise ManifestError("manifest field 'device' is gpu: ONNX Runtime engines run on the CPU")
    if device == "cpu" and (engine_kind == "tensorrt" or precision != "fp32"):
        raise ManifestError(
            f"manifest field 'device' is cpu: a {engine_kind} {precision} engine runs on a GPU"
        )
    return device


def _optional_file(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is not None and (not isinstance(value, str) or not value or "/" in value):
        raise ManifestError(f"manifest field '{key}' must name a file beside the manifest")
    return value


def _rerank_template(data: dict[str, Any], family: str, vocab_size: int) -> RerankTemplate | None:
    """A decoder reranker's template: required for that family, refused for any other; its token
    ids in the vocabulary (an id past it would fail every forward, not the build)."""
    raw = data.get("rerank_template")
    if (raw is not None) != (family == "decoder_reranker"):
        raise ManifestError("manifest field 'rerank_template' is for decoder rerankers, and theirs")
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ManifestError("manifest field 'rerank_template' must be an object")

    def token_ids(key: str) -> tuple[int, ...]:
        value, one = raw.get(key), key.endswith("_id")
        ids = [value] if one else value
        if not isinstance(ids, list) or not all(
            type(t) is int and 0 <= t < vocab_size for t in ids
        ):
            what = "a token id" if one else "a list of token ids"
            raise ManifestError(
                f"manifest field 'rerank_template.{key}' must be {what} in [0, {vocab_size}), "
                f"got {str(value)[:64]}"
            )
        return tuple(ids)

    try:
        return RerankTemplate(
            prefix_ids=token_ids("prefix_ids"),
            body=_require(raw, "body", str, "rerank_template."),
            suffix_ids=token_ids("suffix_ids"),
            instruction=_require(raw, "instruction", str, "rerank_template."),
            yes_id=token_ids("yes_id")[0],
            no_id=token_ids("no_id")[0],
        )
    except ManifestError:
        raise
    except ValueError as err:
        raise ManifestError(f"manifest field 'rerank_template' is invalid: {err}") from None


def _input_names(data: dict[str, Any], version: int, family: str) -> tuple[str, ...]:
    """The graph's inputs: written since format 2; format 1 flagged the third with pair_input."""
    if version == 1:
        pair_input = data.get("pair_input", False)
        if not isinstance(pair_input, bool):
            raise ManifestError(f"manifest field 'pair_input' has the wrong type: {pair_input!r}")
        if pair_input != FAMILY_CONTRACTS[family].takes_pairs:
            raise ManifestError(
                "manifest field 'pair_input' is true exactly for the reranker family"
            )
        return FAMILY_CONTRACTS[family].input_names
    names = _require(data, "input_names", list)
    expected = FAMILY_CONTRACTS[family].input_names
    if tuple(names) != expected:
        raise ManifestError(f"manifest field 'input_names' must be {list(expected)} for {family}")
    return expected


def load_manifest(version_dir: Path) -> Manifest:
    """Reads ``manifest.json`` from a model's version folder."""
    path = Path(version_dir) / MANIFEST_FILE
    if not path.is_file():
        raise ManifestError(
            f"no manifest at {path}: build the model with `python -m builder build`"
        )
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ManifestError(f"manifest {path} is not readable JSON: {err}") from None
    manifest = manifest_from_dict(data)
    for name in (*manifest.engine_files, manifest.tokenizer_file):
        if not (Path(version_dir) / name).is_file():
            raise ManifestError(
                f"manifest names a file that is missing: {Path(version_dir) / name}"
            )
    return manifest
