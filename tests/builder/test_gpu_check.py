"""builder.gpu_check's comparison, driven on the CPU: ONNX Runtime on both sides must pass every
phase; an engine wrong at one batch size of one bucket must fail exactly there."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from builder.gpu_check import check_engine, uncaptured_size
from builder.spec import BuildError, BuildSpec
from python_backend.engines import open_engine
from python_backend.manifest import load_manifest
from tests.builder.test_build import build_onnx


def build_small(repo, folder, name):
    """Two buckets and a long-row profile up to 40 tokens, with the captured sizes a TensorRT
    build would have; returns (manifest, version folder)."""
    version = build_onnx(
        repo, folder, name, buckets=(8, 16), max_length=40, last_bucket=16, max_batch=8,
        token_budget=64,
    ).version_dir  # fmt: skip
    return with_captured_sizes(load_manifest(version)), version


@pytest.fixture(scope="module")
def classifier(tmp_path_factory, tiny_classifier_dir):
    return build_small(tmp_path_factory.mktemp("gpu-check"), tiny_classifier_dir, "clf")


def with_captured_sizes(manifest):
    """ONNX Runtime runs any shape; give the buckets the captured sizes a TensorRT build has."""
    buckets = tuple(
        replace(b, captured_batch_sizes=tuple(sorted({1, 2, b.max_rows}))) for b in manifest.buckets
    )
    return replace(manifest, buckets=buckets)


class WrongAt:
    """The same engine, except one (rows, length) shape returns a corrupted first row."""

    def __init__(self, engine, rows: int, length: int) -> None:
        self.engine, self.layout, self.shape = engine, engine.layout, (rows, length)
        self.output_name, self.output_dim = engine.output_name, engine.output_dim

    def run(self, ids, mask):
        out = self.engine.run(ids, mask)
        if ids.shape == self.shape:
            out[0] = -out[0]
        return out

    def close(self) -> None:
        self.engine.close()


def test_matching_engines_pass_every_phase_at_every_size(classifier):
    manifest, version = classifier
    reference = open_engine(manifest, version)
    results = check_engine(
        open_engine(manifest, version), reference, manifest, 0.9999, np.random.default_rng(0)
    )
    assert all(r.ok for r in results), [r for r in results if not r.ok]
    assert {r.phase for r in results} == {"captured", "eager", "captured-again", "long-rows"}
    for bucket in manifest.buckets:
        for phase in ("captured", "captured-again"):
            sizes = [r.batch for r in results if r.phase == phase and r.length == bucket.length]
            assert sizes == list(bucket.captured_batch_sizes)
    eager = {(r.length, r.batch) for r in results if r.phase == "eager"}
    for bucket in manifest.buckets:
        size = uncaptured_size(bucket.captured_batch_sizes, bucket.max_rows)
        assert (bucket.length, size) in eager and size not in bucket.captured_batch_sizes
    long_lengths = {r.length for r in results if r.phase == "long-rows"}
    assert long_lengths == {17, 28, 40}


def test_an_engine_wrong_at_one_size_fails_there_and_only_there(classifier):
    manifest, version = classifier
    bucket = manifest.buckets[1]
    wrong = WrongAt(open_engine(manifest, version), 2, bucket.length)
    results = check_engine(
        wrong, open_engine(manifest, version), manifest, 0.999, np.random.default_rng(0)
    )
    failed = {(r.phase, r.length, r.batch) for r in results if not r.ok}
    assert failed == {("captured", bucket.length, 2), ("captured-again", bucket.length, 2)}


def test_gpus_are_refused_for_an_engine_that_serves_on_the_cpu():
    with pytest.raises(BuildError, match="--gpus"):
        BuildSpec(engine="onnxruntime", gpus=(0, 1)).validate()
    with pytest.raises(BuildError, match="distinct"):
        BuildSpec(engine="tensorrt", gpus=(0, 0)).validate()


def test_the_build_command_line_takes_the_gpus_to_put_instances_on():
    import argparse

    from builder.spec import add_cli_args, from_cli_args

    parser = argparse.ArgumentParser()
    add_cli_args(parser)
    spec = from_cli_args(parser.parse_args(["--engine", "tensorrt", "--gpus", "0,2,3"]))
    assert spec.validate().gpus == (0, 2, 3)
    assert from_cli_args(parser.parse_args([])).gpus is None
    spec = from_cli_args(parser.parse_args(["--engine", "tensorrt", "--instances-per-gpu", "2"]))
    assert spec.validate().instances_per_gpu == 2
    assert from_cli_args(parser.parse_args([])).instances_per_gpu == 1


def test_instances_per_gpu_are_counted_from_one_and_only_for_tensorrt():
    with pytest.raises(BuildError, match="--instances-per-gpu must be >= 1"):
        BuildSpec(engine="tensorrt", instances_per_gpu=0).validate()
    with pytest.raises(BuildError, match="--instances-per-gpu is for TensorRT"):
        BuildSpec(engine="onnxruntime", instances_per_gpu=2).validate()


def test_a_reranker_is_checked_by_its_score_with_pairs_in_every_row(tmp_path, minilm_dir):
    from builder.tiny_models import save_tiny_model
    from python_backend.contract import split_token_types

    folder = save_tiny_model("reranker", tmp_path / "reranker", minilm_dir / "tokenizer.json")
    manifest, version = build_small(tmp_path / "repo", folder, "rerank")
    seen_types = set()

    class Recording(WrongAt):
        def run(self, ids, mask):
            seen_types.update(np.unique(split_token_types(ids)[1]).tolist())
            return super().run(ids, mask)

    engine = Recording(open_engine(manifest, version), 0, 0)  # wrong at no shape
    results = check_engine(
        engine, open_engine(manifest, version), manifest, 0.999, np.random.default_rng(0)
    )
    assert all(r.ok for r in results) and seen_types == {0, 1}

    class ShiftedAt(WrongAt):
        def run(self, ids, mask):
            out = self.engine.run(ids, mask)
            if ids.shape == self.shape:
                out[0] += 0.5
            return out

    wrong = ShiftedAt(open_engine(manifest, version), 2, manifest.buckets[0].length)
    results = check_engine(
        wrong, open_engine(manifest, version), manifest, 0.999, np.random.default_rng(0)
    )
    # a shifted score is a mismatch although its cosine with the right one (its sign) is 1
    assert {(r.phase, r.batch) for r in results if not r.ok} == {
        ("captured", 2),
        ("captured-again", 2),
    }
