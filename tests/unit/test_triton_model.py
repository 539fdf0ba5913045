"""The Triton glue, with a recording pb_utils and a fake engine: what execute answers at once,
what it queues, how each answer is sent, and what finalize does with a forward still running."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time

import numpy as np
import pytest

from builder.build import default_model_dir
from python_backend.common.cost_models import LinearCost
from python_backend.engines.faults import FaultInjectingEngine, write_fault_spec
from python_backend.scheduling.owners import EngineSource
from testkit.fake_engine import FakeChecksumEngine, layout, manifest_for
from testkit.recording_pb_utils import FakeRequest, RecordingPbUtils, text_request


@pytest.fixture
def pb(monkeypatch):
    recorder = RecordingPbUtils()
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", recorder)
    monkeypatch.delitem(sys.modules, "python_backend.triton_model", raising=False)
    return recorder


def load_model(
    pb, monkeypatch, tmp_path, engine, parameters=None, instance_args=None, name="m", fails=None
):
    """The model class in the role its ``parameters`` give it, loaded from ``tmp_path`` (the
    model's folder, ``name``'s, in the repository) over ``engine``; its engine's load raises
    ``fails`` where given."""
    import python_backend.triton_model as triton_model

    version = tmp_path / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copy(default_model_dir() / "tokenizer.json", version / "tokenizer.json")
    manifest = manifest_for(engine.layout, max_batch=8)
    monkeypatch.setattr(triton_model, "load_manifest", lambda _: manifest)
    opened_on = []

    class Engines(EngineSource):
        def open(self, _manifest, _version_dir, device_id):
            opened_on.append(device_id)
            if fails is not None:
                raise fails
            return engine

    config = {
        "name": name,
        "max_batch_size": 64,
        "parameters": {k: {"string_value": v} for k, v in (parameters or {}).items()},
    }
    model = triton_model.TritonPythonModel()
    model.engines = Engines()
    model.initialize(
        {
            "model_config": json.dumps(config),
            "model_repository": str(tmp_path),
            "model_version": "1",
            **(instance_args or {}),
        }
    )
    model.opened_on = opened_on
    return model


class ClosingEngine(FakeChecksumEngine):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_execute_refuses_bad_requests_at_once_and_answers_good_ones_later(
    pb, monkeypatch, tmp_path
):
    engine = ClosingEngine(layout(max_length=64))
    model = load_model(pb, monkeypatch, tmp_path, engine)
    good = text_request("first row", "second row")
    empty = text_request("fine", "")
    bad_params = text_request("x", parameters="{not json")
    try:
        assert model.execute([good, empty, bad_params]) is None
        # bad ones: answered inside execute, with the status for invalid input
        for request, message in ((empty, "TEXT row 1 is empty"), (bad_params, "not valid JSON")):
            ((response, flags),) = request.sent
            assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
            assert response.error.code == "INVALID_ARG" and message in response.error.message
        assert good.answered.wait(5)
        ((response, flags),) = good.sent
        assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL and response.error is None
        tokens = response.outputs["NUM_TOKENS"]
        assert response.outputs["EMBEDDING"].shape == (2, 3) and tokens.shape == (2, 1)
        # the fake engine's output: (sum of ids, number of real tokens, padded length)
        assert response.outputs["EMBEDDING"][:, 1].tolist() == tokens[:, 0].tolist()
    finally:
        model.finalize()
    assert engine.closed.is_set()


def test_an_error_from_the_scheduler_is_sent_with_its_status(pb, monkeypatch, tmp_path):
    engine = ClosingEngine(layout(max_length=64))
    model = load_model(pb, monkeypatch, tmp_path, engine, {"max_queue_rows": "1"})
    gate_free = text_request("one")
    too_many = text_request("two", "three")
    try:
        model.execute([gate_free, too_many])
        assert too_many.answered.wait(5)
        ((response, _),) = too_many.sent
        assert response.error.code == "UNAVAILABLE" and "queue full" in response.error.message
    finally:
        model.finalize()


def test_finalize_never_closes_the_engine_under_a_live_forward(pb, monkeypatch, tmp_path):
    import python_backend.triton_model as triton_model

    gate = threading.Event()
    engine = ClosingEngine(layout(max_length=64), gate=gate)
    model = load_model(pb, monkeypatch, tmp_path, engine)
    monkeypatch.setattr(triton_model, "SHUTDOWN_DRAIN_S", 0.2)
    request = text_request("stuck in the engine")
    model.execute([request])
    assert engine.wait_for_calls(1)
    model.finalize()
    assert not engine.closed.is_set()
    assert any("still running" in w for w in pb.warnings)
    gate.set()  # the forward ends: its answer is still sent
    assert request.answered.wait(5)
    assert request.sent[0][0].error is None


def test_a_test_repository_file_turns_on_fault_injection(pb, monkeypatch, tmp_path):
    (tmp_path / "1").mkdir()
    write_fault_spec(tmp_path / "1", "poison_token=2023")
    model = load_model(pb, monkeypatch, tmp_path, ClosingEngine(layout(max_length=64)))
    try:
        assert isinstance(model.owner.engine, FaultInjectingEngine)
        request = FakeRequest({"INPUT_IDS": np.array([[101, 2023, 102]], dtype=np.int64)})
        model.execute([request])
        assert request.answered.wait(5)
        ((response, _),) = request.sent
        assert (
            response.error.code == "INTERNAL" and "injected engine fault" in response.error.message
        )
    finally:
        model.finalize()


def test_without_that_file_no_setting_turns_faults_on(pb, monkeypatch, tmp_path):
    monkeypatch.setenv("FAULT_INJECTION", "poison_token=2023")
    monkeypatch.setenv("M__FAULT_INJECTION", "poison_token=2023")
    model = load_model(
        pb,
        monkeypatch,
        tmp_path,
        ClosingEngine(layout(max_length=64)),
        {"fault_injection": "poison_token=2023"},
    )
    try:
        assert not isinstance(model.owner.engine, FaultInjectingEngine)
    finally:
        model.finalize()


def test_an_instance_opens_its_engine_on_the_gpu_triton_names_and_labels_its_metrics(
    pb, monkeypatch, tmp_path
):
    engine = ClosingEngine(layout(max_length=64))
    model = load_model(
        pb,
        monkeypatch,
        tmp_path,
        engine,
        instance_args={
            "model_instance_kind": "GPU",
            "model_instance_device_id": "3",
            "model_instance_name": "m_0_3",
        },
    )
    try:
        assert model.opened_on == [3]
        model.metrics.queue_depth(2)
        model.metrics.flush()
        labels = [dict(lab) for _op, name, lab, _v in pb.calls if name == "planner_queue_rows"]
        assert labels and all(lab["model_instance"] == "m_0_3" for lab in labels)
    finally:
        model.finalize()


def test_a_bug_in_decoding_costs_one_request_and_tells_the_client_no_internals(
    pb, monkeypatch, tmp_path
):
    import python_backend.triton_model as triton_model

    model = load_model(pb, monkeypatch, tmp_path, ClosingEngine(layout(max_length=64)))
    real_decode = triton_model.decode_request

    def decode(inputs, *args, **kw):
        if inputs["TEXT"][0, 0] == b"boom":
            raise KeyError("/secret/path/in/the/server")
        return real_decode(inputs, *args, **kw)

    monkeypatch.setattr(triton_model, "decode_request", decode)
    broken, good = text_request("boom"), text_request("fine")
    try:
        model.execute([broken, good])
        ((response, _),) = broken.sent
        assert response.error.code == "INTERNAL"
        assert "secret" not in response.error.message and "decode" in response.error.message
        assert any("/secret/path" in line for line in pb.errors), "the log says why"
        assert good.answered.wait(5) and good.sent[0][0].error is None
        model.metrics.flush()
        refused = [c for c in pb.calls if c[1] == "planner_refused_total"]
        assert [dict(c[2])["reason"] for c in refused] == ["internal"]
    finally:
        model.finalize()


def wire(instance, manifest, engine):
    """An instance's scheduler, the cost it plans with and its decoder, as initialize builds
    them: from a manifest and the config's parameters, with no Triton call."""
    from python_backend.settings import settings_from_parameters
    from python_backend.triton_model import planning_scheduler, request_decoder

    settings = settings_from_parameters(instance.parameters, instance.model_name)
    scheduler, cost = planning_scheduler(settings, manifest, engine, None, print)
    decoder = request_decoder(instance, manifest, settings, engine.layout.longest_row)
    return scheduler, cost, decoder


def test_an_instance_is_built_from_a_real_manifest_and_its_parameters(pb, tmp_path):
    from python_backend.common.contract import ENGINE_INPUTS, TOKEN_TYPE_INPUT
    from python_backend.triton_model import InstanceArgs

    shutil.copy(default_model_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    engine = FakeChecksumEngine(layout(max_length=64))
    instance = InstanceArgs("m", "m_0_0", tmp_path, 0, 64, {})
    scheduler, cost, decoder = wire(instance, manifest_for(engine.layout, max_batch=8), engine)
    assert cost == LinearCost(64) and scheduler.layout.max_batch == 8
    assert decoder.limits.max_length == 64 and not decoder.limits.pairs
    pairs = manifest_for(
        engine.layout, family="reranker", input_names=(*ENGINE_INPUTS, TOKEN_TYPE_INPUT)
    )
    overridden = InstanceArgs(
        "m", "m_0_0", tmp_path, 0, 64,
        {"overhead_tokens": {"string_value": "300"}, "max_batch": {"string_value": "4"}},
    )  # fmt: skip
    scheduler, cost, decoder = wire(overridden, pairs, engine)
    assert cost == LinearCost(300) and scheduler.layout.max_batch == 4
    assert decoder.limits.pairs


@pytest.mark.parametrize(
    ("engine_kind", "setting", "overlaps"),
    [
        ("onnxruntime", "auto", False),  # its forwards take the cores the overlap would use
        ("tensorrt", "auto", True),
        ("tensorrt", "off", False),
        ("onnxruntime", "on", True),
    ],
)
def test_forwards_overlap_where_the_engine_runs_on_a_gpu_or_where_asked(
    pb, tmp_path, engine_kind, setting, overlaps
):
    from python_backend.triton_model import InstanceArgs

    shutil.copy(default_model_dir() / "tokenizer.json", tmp_path / "tokenizer.json")
    engine = FakeChecksumEngine(layout(max_length=64))
    manifest = manifest_for(
        engine.layout,
        engine_kind=engine_kind,
        engine_version="10" if engine_kind == "tensorrt" else "",
    )
    instance = InstanceArgs(
        "m", "m_0_0", tmp_path, 0, 64, {"overlap_forwards": {"string_value": setting}}
    )
    assert wire(instance, manifest, engine)[0].overlaps is overlaps


class DeclaredOnly:
    """A tensor as the stub hands it over: its declared shape, and data that must not be read."""

    def __init__(self, shape: list[int]) -> None:
        self._shape = shape

    def shape(self) -> list[int]:
        return self._shape

    def as_numpy(self):
        raise AssertionError("the tensor was read before its declared shape was checked")


@pytest.mark.parametrize(
    ("name", "shape", "message"),
    [
        ("TEXT", [1 << 40, 1], "1099511627776 rows; the limit is 64"),
        ("TEXT", [1, 1 << 20], "must have shape [rows, 1]"),
        ("INPUT_IDS", [1, 1 << 40], "declares 1099511627776 tokens a row; the limit is 65536"),
        ("INPUT_IDS", [2, 3, 4], "got rank 3"),
    ],
)
def test_a_declared_shape_past_the_limits_is_refused_before_the_tensor_is_read(
    pb, monkeypatch, tmp_path, name, shape, message
):
    engine = ClosingEngine(layout(max_length=64))
    model = load_model(pb, monkeypatch, tmp_path, engine)
    request = FakeRequest({})
    monkeypatch.setattr(
        pb, "get_input_tensor_by_name", lambda _r, n: DeclaredOnly(shape) if n == name else None
    )
    try:
        model.execute([request])
        ((response, _),) = request.sent
        assert response.error.code == "INVALID_ARG"
        assert name in response.error.message and message in response.error.message
    finally:
        model.finalize()


@pytest.mark.parametrize(
    ("engine_kind", "setting", "pinned"),
    [
        ("tensorrt", "on", True),  # a GPU's engine: the process takes a core of its own
        ("tensorrt", "off", False),
        ("onnxruntime", "on", False),  # the engine computes on every core: never pinned
    ],
)
def test_a_gpu_instance_is_pinned_where_asked_and_a_cpu_engine_never(
    pb, monkeypatch, tmp_path, engine_kind, setting, pinned
):
    import dataclasses

    import python_backend.triton_model as triton_model
    from python_backend.stub.cpu_pinning import Claim

    asked = []

    def pin_to_free_core(directory, owner):
        asked.append(owner)
        return Claim(3, os.open(tmp_path / "claim", os.O_CREAT | os.O_RDWR))

    monkeypatch.setattr(triton_model, "pin_to_free_core", pin_to_free_core)
    engine = FakeChecksumEngine(layout(max_length=64))
    real_manifest_for = manifest_for

    def gpu_manifest(*args, **kw):
        return dataclasses.replace(real_manifest_for(*args, **kw), engine_kind=engine_kind)

    monkeypatch.setattr(sys.modules[__name__], "manifest_for", gpu_manifest)
    model = load_model(pb, monkeypatch, tmp_path, engine, {"pin_cores": setting})
    assert asked == ([True] if pinned else [])  # claimed from the end, as an owner is
    assert (model.pinned is not None) == pinned
    model.finalize()
    if pinned:
        with pytest.raises(OSError):  # its claim is given back with the engine
            os.fstat(model.pinned.fd)


@pytest.fixture
def split(pb, monkeypatch, tmp_path):
    """A front and its queue owner as Triton loads them: the one model class in two roles, each
    told its role by its config, over a fake engine, across a real socket."""
    from python_backend.common.contract import OWNER_PARAMETER, SERVES_PARAMETER

    monkeypatch.setenv("PLANNER_SOCKET_DIR", str(tmp_path / "sockets"))
    engine = ClosingEngine(layout(max_length=64))
    (tmp_path / "m").mkdir()
    owner = load_model(
        pb, monkeypatch, tmp_path / "m_owner", engine, {SERVES_PARAMETER: "m"}, name="m_owner"
    )
    front = load_model(
        pb, monkeypatch, tmp_path / "m", engine, {OWNER_PARAMETER: "m_owner"}, name="m"
    )
    yield front, owner, engine
    front.finalize()
    owner.finalize()


def test_a_front_serves_through_its_queue_owner_in_another_role(pb, split):
    """What a front decodes crosses to the owner's engine and back: each request gets its own
    rows' outputs; a bad one is refused by the front at once; the owner closes its engine."""
    front, owner, engine = split
    assert owner.opened_on == [0] and front.opened_on == []  # only the owner holds the engine
    requests = [text_request(*[f"row {k} of request {j}" for k in range(j + 1)]) for j in range(6)]
    bad = text_request("fine", "")
    assert front.execute([*requests, bad]) is None
    ((response, _),) = bad.sent
    assert response.error.code == "INVALID_ARG" and "TEXT row 1 is empty" in response.error.message
    for request in requests:
        assert request.answered.wait(5)
        ((response, flags),) = request.sent
        assert flags == pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL and response.error is None
        tokens = response.outputs["NUM_TOKENS"][:, 0]
        # the fake engine's output: (sum of ids, number of real tokens, padded length)
        assert response.outputs["EMBEDDING"][:, 1].tolist() == tokens.tolist()
        assert len(tokens) == len(request.inputs["TEXT"]) and engine.calls
    assert front.is_model_ready()
    owner.finalize()
    assert engine.closed.is_set()


def test_a_front_answers_503_once_its_owner_is_gone_and_counts_it(pb, split):
    front, owner, _ = split
    owner.finalize()
    deadline = time.monotonic() + 5
    while front.is_model_ready():  # the socket's monitor reports the disconnection
        assert time.monotonic() < deadline, "the front never saw its owner go"
        time.sleep(0.01)
    request = text_request("nobody to run this")
    front.execute([request])
    assert request.answered.wait(5)
    ((response, _),) = request.sent
    assert response.error.code == "UNAVAILABLE" and "queue owner" in response.error.message
    front.metrics.flush()
    refused = [c for c in pb.calls if c[1] == "planner_refused_total"]
    assert [dict(c[2])["reason"] for c in refused] == ["owner_lost"]


def test_a_request_triton_hands_the_owner_is_refused(pb, split):
    _, owner, _ = split
    (response,) = owner.execute([text_request("misrouted")])
    assert response.error.code == "INVALID_ARG" and "queue owner" in response.error.message


def test_a_front_fails_its_load_with_the_reason_its_owner_failed(pb, monkeypatch, tmp_path):
    from python_backend.common.contract import OWNER_PARAMETER, SERVES_PARAMETER

    monkeypatch.setenv("PLANNER_SOCKET_DIR", str(tmp_path / "sockets"))

    (tmp_path / "m").mkdir()
    with pytest.raises(MemoryError):
        load_model(
            pb, monkeypatch, tmp_path / "m_owner", ClosingEngine(layout()), {SERVES_PARAMETER: "m"},
            name="m_owner", fails=MemoryError("out of memory loading the plan"),
        )  # fmt: skip
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="failed to start: MemoryError: out of memory"):
        load_model(
            pb, monkeypatch, tmp_path / "m", ClosingEngine(layout()), {OWNER_PARAMETER: "m_owner"}
        )
    assert time.monotonic() - started < 5  # at once, not at the front's 600 s wait


def test_a_config_with_both_roles_is_refused_naming_the_rebuild(pb, monkeypatch, tmp_path):
    from python_backend.common.contract import OWNER_PARAMETER, SERVES_PARAMETER

    both = {OWNER_PARAMETER: "m_owner", SERVES_PARAMETER: "m"}
    with pytest.raises(ValueError, match="make build"):
        load_model(pb, monkeypatch, tmp_path, ClosingEngine(layout()), both)


def test_repositories_built_before_the_one_model_class_still_load(pb):
    """Their front and owner model.py files import these names."""
    from python_backend.split_models import FrontModel, OwnerModel
    from python_backend.triton_model import TritonPythonModel

    assert FrontModel is TritonPythonModel and OwnerModel is TritonPythonModel
