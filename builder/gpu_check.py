"""GPU check: TensorRT engine against the ONNX Runtime engine, and per-bucket latency.

    python -m builder.gpu_check [--buckets 16,32,64,128,256] [--work-dir /tmp/gpu-check]

On a GPU node with TensorRT (the builder image): builds MiniLM twice with the same buckets,
TensorRT (fp16, one profile per bucket, CUDA graphs) and ONNX Runtime (fp32), runs the same rows
through both at every bucket, and prints the worst absolute difference, the worst cosine
similarity, and the TensorRT latency at 1 row and at the bucket's max rows, with and without
CUDA-graph replay. Exits non-zero when the outputs disagree beyond FP16 noise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from builder.build import build, tensorrt_ready
from builder.calibrate import median_seconds
from builder.spec import BuildError, BuildSpec
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows
from python_backend.manifest import load_manifest

MIN_COSINE = 0.999  # fp16 TensorRT against fp32 ONNX Runtime, on L2-normalised embeddings


def median_ms(fn) -> float:
    return median_seconds(fn, repeats=20) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--buckets", default="16,32,64,128,256")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/gpu-check"))
    args = parser.parse_args(argv)
    if not tensorrt_ready():
        print("TensorRT and a CUDA GPU are needed for this check", file=sys.stderr)
        return 2
    repo = args.work_dir / "repository"
    common = BuildSpec(
        repository=repo,
        buckets=tuple(int(x) for x in args.buckets.split(",")),
        calibration_repeats=0,
        work_dir=args.work_dir,
        max_batch=128,
        token_budget=32768,
    )
    try:
        build(common.with_(name="trt", engine="tensorrt", precision="fp16"))
        build(common.with_(name="ort", engine="onnxruntime"))
    except BuildError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    trt_manifest = load_manifest(repo / "trt" / "1")
    trt = open_engine(trt_manifest, repo / "trt" / "1")
    ort = open_engine(load_manifest(repo / "ort" / "1"), repo / "ort" / "1", device="auto")
    rng = np.random.default_rng(0)
    ok, previous = True, 0
    print(
        f"{'bucket':>6} {'max|diff|':>10} {'min cos':>8} {'B=1 ms':>8} {'B=max ms':>9} "
        f"{'B=max no-graph ms':>18} {'max rows':>8}"
    )
    for bucket in trt_manifest.buckets:
        lengths = rng.integers(previous + 1, bucket.length + 1, size=min(bucket.max_rows, 32))
        rows = [rng.integers(1000, 29000, n) for n in lengths]
        ids, mask = pad_rows(rows, bucket.length, trt_manifest.pad_token_id)
        a, b = trt.run(ids, mask), ort.run(ids, mask)
        diff = float(np.abs(a - b).max())
        cosine = float(
            np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
        )
        ok &= cosine >= MIN_COSINE
        full = [rng.integers(1000, 29000, bucket.length) for _ in range(bucket.max_rows)]
        full_ids, full_mask = pad_rows(full, bucket.length, trt_manifest.pad_token_id)
        one_ids, one_mask = full_ids[:1], full_mask[:1]
        t_one = median_ms(lambda: trt.run(one_ids, one_mask))  # noqa: B023
        t_full = median_ms(lambda: trt.run(full_ids, full_mask))  # noqa: B023
        profile = trt.profiles[trt_manifest.buckets.index(bucket)]  # type: ignore[attr-defined]
        graphs, profile.graphs = profile.graphs, {}
        t_eager = median_ms(lambda: trt.run(full_ids, full_mask))  # noqa: B023
        profile.graphs = graphs
        print(
            f"{bucket.length:>6} {diff:>10.2e} {cosine:>8.5f} {t_one:>8.2f} {t_full:>9.2f} "
            f"{t_eager:>18.2f} {bucket.max_rows:>8}"
        )
        previous = bucket.length
    print("PASS" if ok else f"FAIL: cosine similarity below {MIN_COSINE}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
