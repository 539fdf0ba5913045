from __future__ import annotations

import json

import pytest

from python_backend.cost_models import LinearCost
from python_backend.manifest import (
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


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (bad(family=None), "manifest field 'family' is missing"),
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


def test_a_long_row_profile_written_before_its_opt_batch_was_chosen_tunes_at_half():
    data = bad(long_rows={"max_rows": 8, "opt_length": 280})
    assert manifest_from_dict(data).long_rows == LongRows(8, 280, 4)
