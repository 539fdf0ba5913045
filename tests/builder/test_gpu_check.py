"""builder.gpu_check's comparison, driven on the CPU: ONNX Runtime on both sides must pass every
phase; an engine wrong at one batch size of one bucket must fail exactly there."""

from __future__ import annotations

import argparse
from dataclasses import replace

import numpy as np
import pytest

from builder.build import build
from builder.engine_compare import check_engine, uncaptured_sizes
from builder.gpu_check import CHECKS, check_model_dir, check_spec, pooling_variant
from builder.spec import BuildError, BuildSpec
from python_backend.common.manifest import load_manifest
from python_backend.engines import open_engine
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
        sizes = uncaptured_sizes(bucket.captured_batch_sizes, bucket.max_rows)
        assert sizes and all((bucket.length, size) in eager for size in sizes)
        assert not set(sizes) & set(bucket.captured_batch_sizes)
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
    from python_backend.common.contract import split_token_types

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


def test_uncaptured_sizes_are_the_smallest_and_largest_without_a_graph():
    assert uncaptured_sizes((1, 2, 4, 8), 8) == [3, 7]
    assert uncaptured_sizes((1, 2, 3), 3) == []
    assert uncaptured_sizes((1, 2, 4), 4) == [3]


def test_the_eager_phase_runs_each_uncaptured_size_at_exactly_that_size(classifier):
    manifest, version = classifier
    engine = open_engine(manifest, version)
    shapes: list[tuple[int, int]] = []

    def run_eagerly(ids, mask):
        shapes.append(ids.shape)
        return engine.run(ids, mask)

    check_engine(engine, engine, manifest, 0.999, np.random.default_rng(0), run_eagerly)
    captured = {b.length: b.captured_batch_sizes for b in manifest.buckets}
    assert shapes and all(batch not in captured[length] for batch, length in shapes)
    assert {length for _, length in shapes} == set(captured)


@pytest.fixture(scope="module")
def gpu_check_args(tmp_path_factory):
    return argparse.Namespace(
        buckets="16,32,64,128", max_length=192, work_dir=tmp_path_factory.mktemp("gpu-check")
    )


def test_the_check_builds_a_long_row_range_and_its_phase_runs(gpu_check_args, minilm_dir):
    """The spec gpu_check builds, built here with ONNX Runtime: its long-row profile exists and
    the long-row phase compares rows above the last bucket."""
    model_dir = check_model_dir("classifier", minilm_dir, gpu_check_args.work_dir)
    spec = check_spec("classifier", model_dir, gpu_check_args)
    result = build(spec.with_(name="ort", engine="onnxruntime"))
    manifest = with_captured_sizes(result.manifest)
    assert manifest.long_rows is not None and manifest.last_bucket < manifest.max_length
    engine = open_engine(manifest, result.version_dir)
    results = check_engine(engine, engine, manifest, 0.999, np.random.default_rng(0))
    long_rows = [r for r in results if r.phase == "long-rows"]
    assert long_rows and all(
        manifest.last_bucket < r.length <= manifest.max_length for r in long_rows
    )
    assert all(r.ok for r in results)
    # MiniLM's check keeps a long-row range too
    embedding = check_spec("embedding", minilm_dir, gpu_check_args)
    assert embedding.last_bucket == 128 < embedding.max_length == 192


def test_a_check_without_a_long_row_range_is_refused(gpu_check_args, minilm_dir):
    args = argparse.Namespace(**{**vars(gpu_check_args), "max_length": 128})
    with pytest.raises(BuildError, match="must exceed the last bucket"):
        check_spec("embedding", minilm_dir, args)


@pytest.mark.parametrize("pooling", ["cls", "max", "lasttoken"])
def test_every_pooling_is_checked_on_a_copy_of_minilm(gpu_check_args, minilm_dir, pooling):
    from builder.families import embedding_pipeline

    check = f"embedding-{pooling}"
    assert CHECKS[check] == ("embedding", pooling)
    folder = check_model_dir(check, minilm_dir, gpu_check_args.work_dir)
    assert embedding_pipeline(folder).pooling == pooling
    assert embedding_pipeline(minilm_dir).pooling == "mean", "the original is never written"
    assert (folder / "model.safetensors").is_symlink()  # weights linked, not copied
    again = pooling_variant(minilm_dir, pooling, folder)  # a rerun replaces the copy
    assert embedding_pipeline(again).pooling == pooling
