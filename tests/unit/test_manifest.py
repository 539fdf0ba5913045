from __future__ import annotations

import json

import pytest

from python_backend.common.cost_models import LinearCost
from python_backend.common.manifest import (
    Bucket,
    LongRows,
    Manifest,
    ManifestError,
    load_manifest,
    manifest_from_dict,
)


def manifest(**changes) -> Manifest:
    fields = dict(
        model_name="m",
        family="embedding",
        output_name="EMBEDDING",
        output_dim=8,
        tokenizer_file="tokenizer.json",
        max_length=300,
        vocab_size=100,
        pad_token_id=0,
        buckets=(Bucket(16, 64, 32, (1, 2, 4, 64)), Bucket(256, 8, 4, ())),
        max_batch=64,
        engine_kind="onnxruntime",
        engine_files=("model.onnx",),
        precision="fp32",
        cost_model=LinearCost(100),
        long_rows=LongRows(4, 280),
    )
    fields.update(changes)
    return Manifest(**fields)


def test_a_decoder_rerankers_template_is_read():
    template = manifest_from_dict(reranker()).rerank_template
    assert template is not None and (template.prefix_ids, template.yes_id) == ((1,), 5)


def test_manifest_round_trips_through_json(tmp_path):
    original = manifest()
    original.write(tmp_path)
    for name in ("model.onnx", "tokenizer.json"):
        (tmp_path / name).write_text("x")
    assert load_manifest(tmp_path) == original
    assert load_manifest(tmp_path).planner_cost() == LinearCost(100)


def bad(**edits):
    data = json.loads(manifest().to_json())
    for key, value in edits.items():
        if value is None:
            del data[key]
        else:
            data[key] = value
    return data


TEMPLATE = {"prefix_ids": [1], "body": "{query} {document}", "suffix_ids": [3], "yes_id": 5}


def reranker(**edits):
    """A decoder reranker's manifest with its template edited."""
    template = {**TEMPLATE, "instruction": "Judge.", "no_id": 6, **edits}
    return bad(
        family="decoder_reranker", output_name="SCORE", output_dim=1, rerank_template=template
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bad(family=None), "manifest field 'family' is missing"),
        (reranker(yes_id=100), "'rerank_template.yes_id' must be a token id in [0, 100), got 100"),
        (reranker(no_id=True), "'rerank_template.no_id' must be a token id"),
        (reranker(prefix_ids=[1, -2]), "'rerank_template.prefix_ids' must be a list of token ids"),
        (reranker(suffix_ids=3), "'rerank_template.suffix_ids' must be a list of token ids"),
        (reranker(body="{query}"), "'rerank_template' is invalid: the rerank template's body"),
        (bad(rerank_template=TEMPLATE), "'rerank_template' is for decoder rerankers"),
        (bad(family="seq2seq"), "manifest field 'family' must be one of"),
        (bad(output_name="LOGITS"), "'output_name' must be EMBEDDING for embedding"),
        (bad(buckets=[]), "'buckets' must not be empty"),
        (
            bad(buckets=[{"length": 16, "max_rows": 0, "opt_rows": 1}]),
            "'buckets[0].max_rows' must be >= 1",
        ),
        (bad(buckets=[{"length": 16, "max_rows": 4}]), "'buckets[0].opt_rows' is missing"),
        (
            bad(
                buckets=[
                    {"length": 32, "max_rows": 4, "opt_rows": 2},
                    {"length": 16, "max_rows": 4, "opt_rows": 2},
                ]
            ),
            "distinct ascending lengths",
        ),
        (bad(max_length=10), "'max_length' is below the last bucket"),
        (bad(engine_kind="tvm"), "'engine_kind' must be one of"),
        (bad(quantization_ranges=[[0.0], [1.0]]), "'quantization_ranges' must be two lists"),
        (bad(normalize="yes"), "'normalize' has the wrong type"),
        (bad(precision="int3"), "'precision' must be one of"),
        (bad(cost_model={"kind": "magic"}), "'cost_model' is invalid"),
        (bad(format_version=7), "'format_version' is 7"),
        (bad(vocab_size="many"), "'vocab_size' has the wrong type"),
        (bad(engine_files=[]), "'engine_files' must list file names"),
        (bad(engine_kind="tensorrt"), "'engine_version' is missing"),
        (bad(engine_kind="tensorrt", engine_version=10), "'engine_version' has the wrong type"),
        (
            bad(long_rows={"max_rows": 4, "opt_length": 280, "opt_rows": 5}),
            "'long_rows.opt_rows' exceeds max_rows",
        ),
    ],
)
def test_an_invalid_manifest_names_the_field(data, message):
    with pytest.raises(ManifestError) as err:
        manifest_from_dict(data)
    assert message in str(err.value)


def test_a_missing_manifest_says_how_to_build_one(tmp_path):
    with pytest.raises(ManifestError, match="python -m builder build"):
        load_manifest(tmp_path)


def test_a_manifest_naming_a_missing_engine_file_is_refused(tmp_path):
    manifest().write(tmp_path)
    (tmp_path / "tokenizer.json").write_text("x")
    with pytest.raises(ManifestError, match=r"missing: .*model\.onnx"):
        load_manifest(tmp_path)


def test_unreadable_json_is_refused(tmp_path):
    (tmp_path / "manifest.json").write_text("{not json")
    with pytest.raises(ManifestError, match="not readable JSON"):
        load_manifest(tmp_path)


def format_1(**edits):
    """The manifest as the builder wrote it before input names and engine profiles."""
    data = bad(**edits)
    del data["input_names"], data["engine_profiles"], data["opt_rows_source"]
    return {**data, "format_version": 1, "pair_input": False}


def test_a_format_1_manifest_is_still_read():
    read = manifest_from_dict(format_1(long_rows={"max_rows": 8, "opt_length": 280}))
    # its long-row profile tuned at half the max rows, as it was built
    assert read.long_rows == LongRows(8, 280, 4)
    assert read.input_names == ("input_ids", "attention_mask") and not read.takes_pairs
    assert read.engine_profiles.long_rows.opt_shape == (4, 280)
    with pytest.raises(ManifestError, match="'pair_input' is true exactly for the reranker"):
        manifest_from_dict({**format_1(), "pair_input": True})


def test_profiles_that_are_not_what_the_buckets_derive_are_refused():
    data = bad()
    data["engine_profiles"]["profiles"][0]["max_shape"] = [999, 16]
    with pytest.raises(ManifestError, match="rebuild the model with `python -m builder build`"):
        manifest_from_dict(data)
    with pytest.raises(ManifestError, match="this server reads 1, 2, 3: rebuild"):
        manifest_from_dict({**bad(), "format_version": 7})


def test_the_engine_profiles_are_the_buckets_then_the_long_rows_in_order():
    profiles = manifest().engine_profiles
    *buckets, long_rows = profiles.profiles
    assert [p.fixed_length for p in buckets] == [b.length for b in manifest().buckets]
    assert all(p.min_shape == (1, p.fixed_length) for p in buckets)
    assert long_rows.fixed_length is None and profiles.long_rows is long_rows
    last, top = manifest().last_bucket, manifest().max_length
    assert long_rows.min_shape == (1, last + 1) and long_rows.max_shape[1] == top
    assert profiles.max_tokens == max(p.max_rows * p.max_shape[1] for p in profiles.profiles)


def test_a_long_row_range_of_one_length_is_still_the_long_row_profile():
    """With the last bucket one below the max length, the long-row profile takes one length
    (min = max): it is marked as the long-row profile, not read as another bucket, and the
    TensorRT engine runs a row of exactly the max length on it."""
    from python_backend.engines.base import BucketLayout
    from python_backend.engines.tensorrt_engine import TensorRTEngine

    one_above = manifest(
        buckets=(Bucket(16, 64, 32, (1, 64)), Bucket(299, 8, 4, ())),
        max_length=300,
        long_rows=LongRows(4, 300),
    )
    profiles = one_above.engine_profiles
    assert [p.fixed_length for p in profiles.buckets] == [16, 299]
    assert profiles.long_rows is profiles.profiles[-1]
    assert profiles.long_rows.min_shape[1] == profiles.long_rows.max_shape[1] == 300
    # the engine's profile selection, over contexts that are only markers (no GPU here)
    engine = TensorRTEngine.__new__(TensorRTEngine)
    engine.layout = BucketLayout.from_manifest(one_above)
    engine.profile_table = profiles
    engine.profiles, engine.long_profile = [], None
    engine._open_context = lambda index, batch: f"context {index}"  # type: ignore[method-assign]
    for index in range(len(profiles.profiles)):
        engine._add_profile(index)
    assert engine._profile_for(300) is engine.long_profile is not None
    assert engine._profile_for(300).index == 2 and engine._profile_for(299).index == 1
    assert engine._profile_for(16).fixed_length == 16


TORCH = {"engine_kind": "torch", "engine_files": ["torch_model.safetensors", "torch_model.json"]}


@pytest.mark.parametrize(
    ("edits", "on_gpu"),
    [
        # written before `device`: where the engine kind and precision said then
        ({**TORCH, "precision": "fp16"}, True),
        ({**TORCH, "precision": "fp32"}, False),
        ({"engine_kind": "tensorrt", "engine_version": "10.13.0", "precision": "fp16"}, True),
        ({}, False),
        # written since: where it says (a decoder in FP32 or BF16 on a GPU)
        ({**TORCH, "precision": "fp32", "device": "gpu"}, True),
        ({**TORCH, "precision": "bf16", "device": "gpu"}, True),
        ({**TORCH, "precision": "fp32", "device": "cpu"}, False),
    ],
)
def test_where_the_engine_runs_is_read_from_old_and_new_manifests(edits, on_gpu):
    data = bad(**edits)
    if "device" not in edits:
        del data["device"]  # as builds before it wrote the manifest
    read = manifest_from_dict(data)
    assert read.runs_on_gpu == on_gpu
    assert read.device == edits.get("device")
    assert manifest_from_dict(json.loads(read.to_json())) == read  # and round-trips


@pytest.mark.parametrize(
    ("edits", "message"),
    [
        ({"precision": "fp16"}, "'precision' is fp16; onnxruntime engines run fp32"),
        (
            {"engine_kind": "tensorrt", "engine_version": "10.13.0", "precision": "bf16"},
            "tensorrt engines run fp32, fp16",
        ),
        ({"device": "tpu"}, "'device' must be one of"),
        ({"device": "gpu"}, "ONNX Runtime engines run on the CPU"),
        ({**TORCH, "precision": "bf16", "device": "cpu"}, "a torch bf16 engine runs on a GPU"),
    ],
)
def test_a_precision_or_device_the_engine_cannot_run_is_refused(edits, message):
    with pytest.raises(ManifestError, match=message):
        manifest_from_dict(bad(**edits))
