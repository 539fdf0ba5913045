"""The builder end to end: build a repository entry, then check the engine against torch."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from builder.build import BuildResult, build
from builder.cli import main as builder_main
from builder.families import load_model, run_rows_alone
from builder.spec import BuildSpec
from builder.triton_config import read_config
from python_backend.common.cost_models import BucketAffineCost
from python_backend.common.manifest import load_manifest
from python_backend.engines import open_engine
from python_backend.engines.base import pad_rows
from testkit.samples import sample_texts_file

# fp32 on CPU: a padded row and the same row alone differ by float reordering only (~1e-7);
# 1e-4 leaves room for BLAS kernels that block differently at different batch shapes
TOLERANCE = 1e-4


def build_onnx(repository: Path, model_dir: Path, name: str, **settings) -> BuildResult:
    """Builds with ONNX Runtime, without calibration unless ``settings`` ask for it."""
    spec = BuildSpec(
        model_dir=model_dir,
        name=name,
        repository=repository,
        engine="onnxruntime",
        calibration_repeats=0,
        quiet=True,
    )
    return build(spec.with_(**settings))


def reference(model_dir: Path, rows: list[np.ndarray], **kw) -> np.ndarray:
    """The torch model on each row alone, no padding at all."""
    return run_rows_alone(load_model(model_dir, **kw), rows)


def rows_for_every_bucket(version_dir: Path, seed: int = 0) -> list[tuple[int, list[np.ndarray]]]:
    """Per bucket: rows whose lengths fall inside it, shortest to longest (padding up to T)."""
    manifest = load_manifest(version_dir)
    rng = np.random.default_rng(seed)
    out, previous = [], 0
    for bucket in manifest.buckets:
        lengths = sorted(
            {previous + 1, bucket.length, int(rng.integers(previous + 1, bucket.length + 1))}
        )
        out.append((bucket.length, [rng.integers(1000, 29000, n) for n in lengths]))
        previous = bucket.length
    return out


def assert_engine_matches_reference(version_dir: Path, model_dir: Path, **kw) -> None:
    manifest = load_manifest(version_dir)
    engine = open_engine(manifest, version_dir)
    for length, rows in rows_for_every_bucket(version_dir):
        ids, mask = pad_rows(rows, length, manifest.pad_token_id)
        served = engine.run(ids, mask)
        expected = reference(model_dir, rows, **kw)
        assert served.shape == (len(rows), manifest.output_dim)
        assert np.abs(served - expected).max() <= TOLERANCE, f"bucket {length}"


def test_minilm_engine_matches_torch_on_each_row_alone_at_every_bucket(tmp_path, minilm_dir):
    version = build_onnx(
        tmp_path,
        minilm_dir,
        "minilm",
        buckets=(16, 48, 128, 256),
        texts_file=sample_texts_file(tmp_path),
    ).version_dir
    manifest = load_manifest(version)
    assert manifest.family == "embedding" and manifest.output_dim == 384
    assert [b.length for b in manifest.buckets] == [16, 48, 128, 256]
    assert manifest.source["pooling"] == "mean" and manifest.source["normalize"] is True
    assert_engine_matches_reference(version, minilm_dir)
    config = read_config(tmp_path / "minilm" / "config.pbtxt")
    assert [o.name for o in config.output] == ["EMBEDDING", "NUM_TOKENS", "TIMINGS"]
    assert (version / "model.py").is_file() and (version / "tokenizer.json").is_file()


def test_tiny_classifier_engine_matches_torch(tmp_path, tiny_classifier_dir):
    version = build_onnx(
        tmp_path, tiny_classifier_dir, "clf", buckets=(8, 24, 64), max_length=64
    ).version_dir
    manifest = load_manifest(version)
    assert (manifest.family, manifest.output_name, manifest.output_dim) == (
        "classifier",
        "LOGITS",
        3,
    )
    assert_engine_matches_reference(version, tiny_classifier_dir)


def test_tiny_decoder_scores_the_last_real_token_of_each_row(tmp_path, tiny_decoder_dir):
    version = build_onnx(
        tmp_path,
        tiny_decoder_dir,
        "decider",
        buckets=(8, 24, 64),
        max_length=64,
        score_token_ids=(2023, 2025),
    ).version_dir
    manifest = load_manifest(version)
    assert (manifest.family, manifest.output_name, manifest.output_dim) == ("decoder", "LOGITS", 2)
    assert_engine_matches_reference(version, tiny_decoder_dir, score_token_ids=[2023, 2025])


def test_rows_above_the_last_bucket_run_at_their_exact_length(tmp_path, tiny_classifier_dir):
    version = build_onnx(
        tmp_path, tiny_classifier_dir, "clf", buckets=(8, 16), max_length=40, last_bucket=16
    ).version_dir
    manifest = load_manifest(version)
    assert manifest.long_rows is not None and manifest.max_length == 40
    engine = open_engine(manifest, version)
    assert engine.layout.pad_len(30) == 30 and not engine.layout.mergeable(30)
    rows = [np.arange(1000, 1030), np.arange(2000, 2030)]
    ids, mask = pad_rows(rows, 30, 0)
    assert np.abs(engine.run(ids, mask) - reference(tiny_classifier_dir, rows)).max() <= TOLERANCE


def test_buckets_are_chosen_from_a_length_sample(tmp_path, tiny_classifier_dir):
    sample = tmp_path / "lengths.txt"
    sample.write_text("\n".join(str(n) for n in [5] * 60 + [12] * 30 + [50] * 10))
    result = build_onnx(
        tmp_path, tiny_classifier_dir, "clf", lengths_file=sample, num_buckets=3, max_length=64
    )
    assert result.buckets.lengths == (5, 12, 64) and result.buckets.source == "sample"
    assert result.buckets.padding_efficiency > result.buckets.power_of_two_efficiency
    manifest = load_manifest(tmp_path / "clf" / "1")
    assert [b.length for b in manifest.buckets] == [5, 12, 64]
    # each profile's opt batch is what the planner runs on queues drawn from the same sample
    assert manifest.opt_rows_source["method"].startswith("simulated")
    assert manifest.opt_rows_source["sample_rows"] == 100
    assert all(1 <= b.opt_rows <= b.max_rows for b in manifest.buckets)


def test_calibration_stores_a_fitted_cost_model(tmp_path, tiny_classifier_dir):
    result = build_onnx(
        tmp_path,
        tiny_classifier_dir,
        "clf",
        buckets=(8, 32),
        max_length=32,
        calibration_repeats=1,
        token_budget=256,
    )
    assert any("worst relative error" in line for line in result.summary())
    manifest = load_manifest(tmp_path / "clf" / "1")
    assert manifest.cost_model == result.manifest.cost_model  # stored and read back alike
    assert isinstance(manifest.cost_model, BucketAffineCost)
    assert manifest.calibration["table"]["lengths"] == [8, 32]
    cost = manifest.planner_cost()
    assert cost.cost(8, 32) > cost.cost(8, 8) > cost.cost(1, 8) > 0
    json.dumps(manifest.calibration)  # stored as plain JSON


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model-dir", "/nonexistent"], "has no config.json"),
        (["--buckets", "16,abc"], "--buckets takes comma-separated integers"),
        (["--max-length", "0"], "--max-length must be >= 1"),
        (["--max-length", "4096"], "exceeds the model's limit 256"),
        (
            ["--last-bucket", "300", "--max-length", "256"],
            "--last-bucket 300 exceeds --max-length 256",
        ),
        (["--precision", "fp16", "--engine", "onnxruntime"], "--precision fp16 is for TensorRT"),
        (["--score-token-ids", "1,2"], "--score-token-ids applies to decoder models only"),
        (["--name", "bad/name"], "--name must be letters"),
        (["--lengths-file", "/nonexistent.txt"], "--lengths-file /nonexistent.txt does not exist"),
    ],
)
def test_bad_builder_arguments_give_clear_errors(tmp_path, args, message, capsys):
    code = builder_main(
        ["build", "--repository", str(tmp_path), "--calibration-repeats", "0", "--quiet", *args]
    )
    assert code == 2
    assert message in capsys.readouterr().err


def test_tensorrt_is_refused_clearly_where_it_cannot_run(tmp_path, capsys):
    pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    code = builder_main(["build", "--repository", str(tmp_path), "--engine", "tensorrt", "--quiet"])
    assert code == 2
    assert "--engine tensorrt needs TensorRT and a CUDA GPU" in capsys.readouterr().err


def test_the_decoder_head_equals_the_models_own_last_token_logits(tiny_decoder_dir):
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(tiny_decoder_dir, attn_implementation="eager")
    rng = np.random.default_rng(0)
    rows = [rng.integers(1000, 29000, n) for n in (3, 9, 17)]
    with torch.no_grad():  # transformers' own logits, each row alone, at its last token
        want = np.stack([full(input_ids=torch.tensor(r)[None]).logits[0, -1].numpy() for r in rows])
    for token_ids in (None, [2023, 2025]):
        scorer = load_model(tiny_decoder_dir, score_token_ids=token_ids).module
        seen: list[torch.Size] = []

        def record(module, args, out, seen=seen):
            seen.append(args[0].shape)

        hook = scorer.head.register_forward_hook(record)
        ids, mask = pad_rows(rows, 24, 0)
        with torch.no_grad():
            got = scorer(torch.tensor(ids), torch.tensor(mask)).numpy()
        hook.remove()
        expected = want[:, token_ids] if token_ids else want
        assert np.abs(got - expected).max() <= TOLERANCE
        # the projection sees one hidden state per row, never [B, T, H]
        assert seen == [torch.Size([3, 32])]


def test_a_decoder_that_changes_its_logits_after_the_head_is_refused(tiny_decoder_dir):
    from transformers import AutoModelForCausalLM

    from builder.families import LastTokenScorer, check_last_token_scorer

    model = AutoModelForCausalLM.from_pretrained(tiny_decoder_dir).eval()
    scorer = LastTokenScorer(model, None)

    class Capped(torch.nn.Module):  # logits soft-capped after lm_head, as some models do
        def forward(self, input_ids, attention_mask):
            out = model(input_ids=input_ids, attention_mask=attention_mask)
            out.logits = torch.tanh(out.logits / 0.01) * 0.01
            return out

    check_last_token_scorer(scorer, model, 30522)  # the model itself passes
    with pytest.raises(ValueError, match="after lm_head"):
        check_last_token_scorer(scorer, Capped(), 30522)


def test_no_wrapper_builds_a_key_value_cache(tiny_decoder_dir):
    """Every forward here is prefill only: the decoder under the scorer returns no cache (one
    would be built in every forward, and kept inside every CUDA graph), with the same logits."""
    from python_backend.engines.torch_modules import ClassifierHead, EmbeddingHead

    scorer = load_model(tiny_decoder_dir).module
    caches: list[object] = []
    hook = scorer.body.register_forward_hook(
        lambda module, args, out: caches.append(out.past_key_values)
    )
    ids, mask = pad_rows([np.arange(5, 12), np.arange(5, 9)], 8, 0)
    with torch.no_grad():
        scorer(torch.tensor(ids), torch.tensor(mask))
    hook.remove()
    assert caches == [None]
    # the other wrappers set their model the same way (a decoder can embed or classify)
    from transformers import AutoModelForCausalLM

    for wrap in (lambda m: EmbeddingHead(m.base_model, "lasttoken", True), ClassifierHead):
        model = AutoModelForCausalLM.from_pretrained(tiny_decoder_dir)
        assert model.config.use_cache
        wrap(model)
        assert not model.config.use_cache


def test_a_build_from_the_same_model_and_settings_does_nothing_and_any_change_builds(
    tmp_path, tiny_classifier_dir, capsys
):
    """What compose's one-shot builder does at every `up`: engines built from the same model,
    settings and runtime are kept as they are; a changed setting, a changed model file or
    --force builds again."""
    import shutil

    model = tmp_path / "model"
    shutil.copytree(tiny_classifier_dir, model)
    repository = tmp_path / "repository"
    settings = {"buckets": (8, 24), "max_length": 24}
    first = build_onnx(repository, model, "clf", **settings)
    engine = first.version_dir / first.manifest.engine_files[0]

    def written() -> dict[str, int]:
        return {
            str(p.relative_to(repository)): p.stat().st_mtime_ns
            for p in repository.rglob("*")
            if p.is_file()
        }

    before = written()
    again = build_onnx(repository, model, "clf", **settings)
    assert written() == before, "nothing was written again"
    assert again.manifest == first.manifest and again.seconds == 0.0
    # the command line says so, and does the same
    capsys.readouterr()
    args = ["build", f"--model-dir={model}", "--name=clf", f"--repository={repository}",
            "--engine=onnxruntime", "--calibration-repeats=0", "--buckets=8,24",
            "--max-length=24"]  # fmt: skip
    assert builder_main(args) == 0
    assert "nothing to do" in capsys.readouterr().out and written() == before

    def rebuilt(**changes) -> bool:
        mtime = engine.stat().st_mtime_ns
        build_onnx(repository, model, "clf", **{**settings, **changes})
        return engine.stat().st_mtime_ns != mtime

    assert rebuilt(max_batch=32), "a changed setting builds again"
    assert load_manifest(first.version_dir).max_batch == 32
    assert not rebuilt(max_batch=32)
    config = json.loads((model / "config.json").read_text())
    config["layer_norm_eps"] = config.get("layer_norm_eps", 1e-12) * 10
    (model / "config.json").write_text(json.dumps(config))
    assert rebuilt(max_batch=32), "a changed model file builds again"
    assert rebuilt(max_batch=32, force=True), "--force builds again"
    # a build stopped half way (its key removed first) is built again, not taken as done
    (first.version_dir / "build_key.txt").unlink()
    assert rebuilt(max_batch=32)
    (first.version_dir / "model.py").unlink()  # an entry missing a file of its own
    assert rebuilt(max_batch=32) and (first.version_dir / "model.py").is_file()
