"""The torch engine on the CPU (FP32, no graphs): the same rows through it and through ONNX
Runtime, both built by the builder from one model, agree within 1e-5 for every family; its
artifact is refused, by name, where it cannot be rebuilt; and both GPU engines run their device,
buffers and capture through the one shared module."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import numpy as np
import pytest

from builder.build import build
from builder.spec import BuildError, BuildSpec
from python_backend.common.contract import pack_token_types
from python_backend.common.manifest import load_manifest
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows
from python_backend.engines.torch_engine import TorchEngine
from python_backend.engines.torch_modules import (
    TORCH_RECORD,
    TORCH_WEIGHTS,
    TorchModelError,
    load_torch_model,
)
from testkit.samples import sample_texts_file

ROOT = Path(__file__).resolve().parents[2]
MAX_ABS = 1e-5  # FP32 torch against FP32 ONNX Runtime, on the same padded rows


def build_both(repository: Path, model_dir: Path, **settings) -> tuple[Path, Path]:
    """The same model built as a torch engine and as an ONNX Runtime engine: (torch, ORT)."""
    spec = BuildSpec(
        model_dir=model_dir, repository=repository, calibration_repeats=0, quiet=True
    ).with_(**settings)
    build(spec.with_(name="torch", engine="torch"))
    build(spec.with_(name="ort", engine="onnxruntime"))
    return repository / "torch" / "1", repository / "ort" / "1"


@pytest.fixture(scope="module")
def tiny_reranker_dir(tmp_path_factory, minilm_dir) -> Path:
    from builder.tiny_models import save_tiny_model

    folder = tmp_path_factory.mktemp("tiny-reranker")
    return save_tiny_model("reranker", folder, minilm_dir / "tokenizer.json")


@pytest.fixture(scope="module")
def minilm_pair(tmp_path_factory, minilm_dir):
    """MiniLM as it is served (mean pooling, normalised), with rows above the last bucket."""
    repo = tmp_path_factory.mktemp("torch-minilm")
    return build_both(
        repo,
        minilm_dir,
        buckets=(16, 64),
        last_bucket=64,
        max_length=96,
        texts_file=sample_texts_file(repo),
    )


def padded_groups(manifest, seed: int, pairs: bool = False):
    """Per length the engine runs (each bucket, and lengths above the last one): rows as long
    as that length and shorter, right-padded to it."""
    rng = np.random.default_rng(seed)
    lengths = [b.length for b in manifest.buckets]
    if manifest.long_rows is not None:
        lengths += [manifest.last_bucket + 1, manifest.max_length]
    for length in lengths:
        rows = [rng.integers(1000, 29000, n) for n in (1, length // 2, length, length)]
        if pairs:
            rows = [pack_token_types(r, np.arange(len(r)) >= len(r) // 2) for r in rows]
        yield length, pad_rows(rows, length, manifest.pad_token_id)


def assert_same_outputs(torch_dir: Path, ort_dir: Path, pairs: bool = False) -> None:
    manifest = load_manifest(torch_dir)
    assert manifest.engine_kind == "torch" and manifest.precision == "fp32"
    assert not manifest.runs_on_gpu and all(not b.captured_batch_sizes for b in manifest.buckets)
    engine = open_engine(manifest, torch_dir)
    reference = open_engine(load_manifest(ort_dir), ort_dir)
    assert isinstance(engine, TorchEngine) and engine.cuda is None
    for length, (ids, mask) in padded_groups(manifest, seed=length_seed(torch_dir), pairs=pairs):
        got, want = engine.run(ids, mask), reference.run(ids, mask)
        assert got.shape == want.shape == (len(ids), manifest.output_dim)
        assert got.dtype == np.float32
        diff = float(np.abs(got - want).max())
        assert diff <= MAX_ABS, f"length {length}: max abs difference {diff:.2e}"
    engine.close()
    reference.close()


def length_seed(path: Path) -> int:
    return sum(path.as_posix().encode()) % 1000


def test_minilm_on_the_torch_engine_matches_onnx_runtime(minilm_pair):
    assert_same_outputs(*minilm_pair)


@pytest.mark.parametrize("family", ["classifier", "decoder", "reranker"])
def test_each_family_on_the_torch_engine_matches_onnx_runtime(
    family, tmp_path, tiny_classifier_dir, tiny_decoder_dir, tiny_reranker_dir
):
    model_dir = {
        "classifier": tiny_classifier_dir,
        "decoder": tiny_decoder_dir,
        "reranker": tiny_reranker_dir,
    }[family]
    pair = build_both(tmp_path, model_dir, buckets=(16, 32), last_bucket=32, max_length=48)
    assert load_manifest(pair[0]).family == family
    assert_same_outputs(*pair, pairs=family == "reranker")


def test_the_torch_build_writes_its_files_and_no_stale_engine(minilm_pair, tmp_path, minilm_dir):
    torch_dir, _ = minilm_pair
    manifest = load_manifest(torch_dir)
    assert manifest.engine_files == (TORCH_WEIGHTS, TORCH_RECORD)
    record = json.loads((torch_dir / TORCH_RECORD).read_text())
    assert record["wrapper"] == "embedding"
    # Normalize is the server's: out of the module, in the manifest
    assert record["settings"] == {"pooling": "mean", "normalize": False, "dense": []}
    assert manifest.normalize and not manifest.graph_normalizes
    # an ONNX Runtime build of the same name, then a torch one: the ONNX file goes
    spec = BuildSpec(
        model_dir=minilm_dir, repository=tmp_path, name="m", buckets=(16,), max_length=16,
        calibration_repeats=0, texts_file=sample_texts_file(tmp_path), quiet=True,
    )  # fmt: skip
    build(spec.with_(engine="onnxruntime"))
    assert (tmp_path / "m" / "1" / "model.onnx").is_file()
    build(spec.with_(engine="torch"))
    assert not (tmp_path / "m" / "1" / "model.onnx").exists()
    assert (tmp_path / "m" / "1" / TORCH_WEIGHTS).is_file()


def test_fp16_without_a_gpu_is_refused_naming_the_way_out(tmp_path, minilm_dir):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    spec = BuildSpec(model_dir=minilm_dir, repository=tmp_path, engine="torch", precision="fp16")
    with pytest.raises(BuildError, match="--precision fp32"):
        build(spec.with_(quiet=True, calibration_repeats=0))


def test_an_artifact_that_cannot_be_rebuilt_is_refused_by_name(minilm_pair, tmp_path):
    import shutil

    import torch

    torch_dir, _ = minilm_pair
    for name in (TORCH_WEIGHTS, TORCH_RECORD):
        shutil.copyfile(torch_dir / name, tmp_path / name)
    record = json.loads((tmp_path / TORCH_RECORD).read_text())
    cpu = torch.device("cpu")

    (tmp_path / TORCH_RECORD).write_text(json.dumps({**record, "wrapper": "pooler"}))
    with pytest.raises(TorchModelError, match="unknown wrapper 'pooler'"):
        load_torch_model(tmp_path, torch.float32, cpu)

    (tmp_path / TORCH_RECORD).write_text(json.dumps({**record, "format": 99}))
    with pytest.raises(TorchModelError, match="format 99"):
        load_torch_model(tmp_path, torch.float32, cpu)

    # weights of another shape than the record's transformer: refused, not half-loaded
    config = {**record["transformer_config"], "num_hidden_layers": 7}
    (tmp_path / TORCH_RECORD).write_text(json.dumps({**record, "transformer_config": config}))
    with pytest.raises(TorchModelError, match="does not match"):
        load_torch_model(tmp_path, torch.float32, cpu)


def calls(path: Path) -> set[str]:
    """Every dotted name called or imported in a module, read with ``ast``."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Attribute):
            parts, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                parts.append(value.attr)
                value = value.value
            if isinstance(value, ast.Name):
                names.add(".".join([value.id, *reversed(parts)]))
    return names


@pytest.mark.parametrize("engine", ["tensorrt_engine.py", "torch_engine.py"])
def test_both_gpu_engines_capture_and_stage_through_the_shared_module(engine):
    """The device, stream, pinned buffers, pad rows and graph capture are
    ``cuda_graphs.CudaForwards`` and ``capture_all`` for both engines: neither does them itself."""
    engines = ROOT / "python_backend" / "engines"
    used = calls(engines / engine)
    assert "python_backend.engines.cuda_graphs.CudaForwards" in used
    assert "python_backend.engines.cuda_graphs.capture_all" in used
    for own in (
        "torch.cuda.graph",
        "torch.cuda.CUDAGraph",
        "torch.cuda.Stream",
        "torch.cuda.set_device",
        "torch.cuda.stream",
    ):
        assert own not in used, f"{engine} calls {own} itself"
    shared = calls(engines / "cuda_graphs.py")
    assert {"torch.cuda.graph", "torch.cuda.CUDAGraph", "torch.cuda.Stream"} <= shared


def test_the_torch_engine_is_calibrated_like_any_other(tmp_path, tiny_classifier_dir):
    """The builder times the torch engine and fits the planner's cost model on it."""
    spec = BuildSpec(
        model_dir=tiny_classifier_dir, repository=tmp_path, name="t", engine="torch",
        buckets=(16, 32), max_length=32, calibration_repeats=1, quiet=True,
    )  # fmt: skip
    manifest = build(spec).manifest
    table = manifest.calibration["table"]
    assert table["lengths"] == [16, 32] and all(t > 0 for t in table["times_us"][0] if t)
    assert manifest.calibration["fit"]["overhead_tokens"] >= 0
    assert load_manifest(tmp_path / "t" / "1").cost_model == manifest.cost_model
