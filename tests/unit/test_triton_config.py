from __future__ import annotations

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from builder.triton_config import (
    MODEL_PY,
    add_model_variant,
    gpu_instances,
    model_config,
    read_config,
    write_config,
)

ROOT = Path(__file__).resolve().parents[2]


def test_generated_config_parses_as_triton_model_config(tmp_path):
    write_config(model_config("m", "LOGITS", 3, {"max_queue_rows": "10"}), tmp_path)
    config = read_config(tmp_path / "config.pbtxt")
    assert config.name == "m" and config.backend == "python" and config.max_batch_size == 64
    assert [i.name for i in config.input] == ["TEXT", "INPUT_IDS", "ATTENTION_MASK"]
    assert all(i.optional for i in config.input)
    assert [(o.name, list(o.dims)) for o in config.output] == [
        ("LOGITS", [3]),
        ("NUM_TOKENS", [1]),
        ("TIMINGS", [3]),
    ]
    assert config.parameters["max_queue_rows"].string_value == "10"
    assert not config.HasField("dynamic_batching"), "the model batches for itself"
    assert not config.model_transaction_policy.decoupled


def test_committed_default_model_matches_what_the_builder_writes():
    committed = read_config(ROOT / "model_repository" / "minilm" / "config.pbtxt")
    assert committed == model_config("minilm", "EMBEDDING", 384)
    assert (ROOT / "model_repository" / "minilm" / "1" / "model.py").read_text() == MODEL_PY


def test_a_model_variant_shares_the_engine_files_and_overrides_parameters(tmp_path):
    version = tmp_path / "base" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_text("engine")
    (version / "model.py").write_text("base model")
    write_config(model_config("base", "LOGITS", 3, {"max_queue_rows": "10"}), tmp_path / "base")
    add_model_variant(tmp_path, "base", "variant", {"planner": "per_bucket"})
    variant = read_config(tmp_path / "variant" / "config.pbtxt")
    assert variant.name == "variant"
    assert (variant.output[0].name, list(variant.output[0].dims)) == ("LOGITS", [3])
    assert variant.parameters["planner"].string_value == "per_bucket"
    assert variant.parameters["max_queue_rows"].string_value == "10"
    linked = tmp_path / "variant" / "1" / "model.onnx"
    assert linked.is_symlink() and linked.resolve() == (version / "model.onnx").resolve()
    assert (tmp_path / "variant" / "1" / "model.py").read_text() == "base model"
    add_model_variant(tmp_path, "base", "peer", model_py="peer model")
    assert (tmp_path / "peer" / "1" / "model.py").read_text() == "peer model"


def test_a_gpu_config_puts_one_instance_with_its_own_queue_on_each_named_gpu(tmp_path):
    write_config(model_config("m", "EMBEDDING", 8, instances=gpu_instances((0, 1, 2, 3))), tmp_path)
    (group,) = read_config(tmp_path / "config.pbtxt").instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU
    # Triton starts `count` instances on each GPU of the list: one per GPU
    assert group.count == 1 and list(group.gpus) == [0, 1, 2, 3]
    text = (tmp_path / "config.pbtxt").read_text()
    assert "KIND_GPU" in text and "KIND_CPU" not in text


def test_a_gpu_config_may_put_several_instances_on_each_gpu(tmp_path):
    write_config(model_config("m", "EMBEDDING", 8, instances=gpu_instances((0, 1), 3)), tmp_path)
    (group,) = read_config(tmp_path / "config.pbtxt").instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU
    assert group.count == 3 and list(group.gpus) == [0, 1]


def test_a_gpu_config_without_a_list_takes_every_gpu_triton_sees(tmp_path):
    write_config(model_config("m", "EMBEDDING", 8, instances=gpu_instances()), tmp_path)
    (group,) = read_config(tmp_path / "config.pbtxt").instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU and group.count == 1
    assert list(group.gpus) == []


def test_a_variant_of_a_gpu_model_keeps_its_instances(tmp_path):
    version = tmp_path / "base" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text("base model")
    write_config(
        model_config("base", "LOGITS", 3, instances=gpu_instances((0, 1))), tmp_path / "base"
    )
    variant = add_model_variant(tmp_path, "base", "variant")
    assert list(variant.instance_group[0].gpus) == [0, 1]


def test_a_split_build_writes_fronts_and_their_owner_and_a_plain_rebuild_removes_it(tmp_path):
    from builder.build import Progress, write_entry
    from builder.spec import BuildSpec
    from python_backend.common.contract import OWNER_PARAMETER, SERVES_PARAMETER
    from testkit.fake_engine import layout, manifest_for

    manifest = manifest_for(layout())
    version = tmp_path / "m" / "1"
    version.mkdir(parents=True)
    quiet = Progress(1, quiet=True)
    write_entry(BuildSpec(name="m", repository=tmp_path, fronts=3), manifest, version, quiet)
    front = read_config(tmp_path / "m" / "config.pbtxt")
    owner = read_config(tmp_path / "m_owner" / "config.pbtxt")
    assert front.parameters[OWNER_PARAMETER].string_value == "m_owner"
    assert [(g.kind, g.count) for g in front.instance_group] == [
        (mc.ModelInstanceGroup.KIND_CPU, 3)
    ]
    assert (version / "model.py").read_text() == MODEL_PY  # one entry point, every role
    assert owner.parameters[SERVES_PARAMETER].string_value == "m" and owner.max_batch_size == 0
    assert [(g.kind, g.count) for g in owner.instance_group] == [
        (mc.ModelInstanceGroup.KIND_CPU, 1)
    ]
    assert not owner.input, "the owner is fed by its fronts' socket, not by Triton"
    assert (tmp_path / "m_owner" / "1" / "model.py").read_text() == MODEL_PY
    # the settings reach the owner's scheduler: its parameters block has them all
    assert set(front.parameters) - {OWNER_PARAMETER} == set(owner.parameters) - {SERVES_PARAMETER}

    write_entry(BuildSpec(name="m", repository=tmp_path), manifest, version, quiet)
    assert not (tmp_path / "m_owner").exists()
    assert (version / "model.py").read_text() == MODEL_PY
    assert OWNER_PARAMETER not in read_config(tmp_path / "m" / "config.pbtxt").parameters


def test_fronts_and_instances_per_gpu_exclude_each_other():
    import pytest

    from builder.spec import BuildError, BuildSpec

    with pytest.raises(BuildError, match="--fronts and --instances-per-gpu"):
        BuildSpec(engine="tensorrt", fronts=2, instances_per_gpu=2).validate()
    with pytest.raises(BuildError, match="--fronts must be >= 0"):
        BuildSpec(fronts=-1).validate()
