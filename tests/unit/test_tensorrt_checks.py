"""What the TensorRT runtime and builder decide at load, on stand-ins for TensorRT's objects: the
version rules, the I/O contract, the contexts opened, the capture fallback and the timing
cache."""

from __future__ import annotations

import pytest

from builder.timing_cache import save_timing_cache, use_timing_cache, write_atomically
from python_backend.engines.cuda_graphs import capture_all
from python_backend.engines.tensorrt_checks import (
    ContextSlot,
    EngineContractError,
    IOTensor,
    check_io_contract,
    context_slots,
    require_built_by,
    require_supported_major,
)

GOOD = [
    IOTensor("input_ids", True, "INT64", 2),
    IOTensor("attention_mask", True, "INT64", 2),
    IOTensor("EMBEDDING", False, "FLOAT", 2),
]


def test_a_plan_from_another_tensorrt_is_refused_naming_both_versions():
    require_built_by("10.16.1.11", "10.16.1.11", "model.plan")
    with pytest.raises(EngineContractError) as err:
        require_built_by("10.13.3.9", "10.16.1.11", "model.plan")
    assert "10.13.3.9" in str(err.value) and "10.16.1.11" in str(err.value)
    with pytest.raises(EngineContractError, match="does not record"):
        require_built_by("", "10.16.1.11", "model.plan")


def test_the_io_contract_accepts_exactly_what_the_runtime_binds():
    check_io_contract(GOOD, "EMBEDDING")
    check_io_contract(reversed(GOOD), "EMBEDDING")


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        ([GOOD[0], GOOD[1]], "'EMBEDDING' is missing"),
        ([GOOD[0], GOOD[2]], "'attention_mask' is missing"),
        ([*GOOD, IOTensor("token_type_ids", True, "INT64", 2)], "input tensor 'token_type_ids'"),
        ([IOTensor("input_ids", True, "INT32", 2), GOOD[1], GOOD[2]], "'input_ids' is INT32"),
        ([GOOD[0], GOOD[1], IOTensor("EMBEDDING", False, "HALF", 2)], "'EMBEDDING' is HALF"),
        ([GOOD[0], GOOD[1], IOTensor("EMBEDDING", False, "FLOAT", 3)], "'EMBEDDING' has rank 3"),
        ([GOOD[0], GOOD[1], IOTensor("EMBEDDING", True, "FLOAT", 2)], "must be an output"),
        ([*GOOD[:2], IOTensor("LOGITS", False, "FLOAT", 2)], "output tensor 'LOGITS'"),
    ],
)
def test_an_engine_that_breaks_the_io_contract_is_refused_naming_the_tensor(tensors, message):
    with pytest.raises(EngineContractError) as err:
        check_io_contract(tensors, "EMBEDDING")
    assert message in str(err.value)


def test_a_size_that_cannot_be_captured_runs_eagerly_and_the_rest_keep_their_graphs():
    logged: list[str] = []

    def capture(profile: int, batch: int) -> str:
        if (profile, batch) == (1, 64):
            raise RuntimeError("operation not permitted when stream is capturing")
        return f"graph {profile}/{batch}"

    sizes = [(0, 1), (0, 64), (1, 1), (1, 64)]
    graphs, eager = capture_all(sizes, capture, logged.append)
    assert graphs == {(0, 1): "graph 0/1", (0, 64): "graph 0/64", (1, 1): "graph 1/1"}
    assert eager == [(1, 64)]
    assert len(logged) == 1 and "bucket 1, batch 64" in logged[0]
    assert "not permitted" in logged[0]


class FakeCache:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def serialize(self) -> bytes:
        return self.data + b"+timings"


class FakeBuilderConfig:
    """IBuilderConfig's timing-cache calls, as TensorRT 10 behaves: a cache from another GPU is
    created but refused by set_timing_cache (False); bytes that are no cache at all raise."""

    def __init__(self) -> None:
        self.cache: FakeCache | None = None

    def create_timing_cache(self, data: bytes) -> FakeCache:
        if data.startswith(b"garbage"):
            raise RuntimeError("Deserialization failed")
        return FakeCache(data)

    def set_timing_cache(self, cache: FakeCache, ignore_mismatch: bool) -> bool:
        assert ignore_mismatch is False, "a mismatched cache must never be used silently"
        if cache.data.startswith(b"other-gpu"):
            return False
        self.cache = cache
        return True

    def get_timing_cache(self) -> FakeCache:
        assert self.cache is not None
        return self.cache


@pytest.mark.parametrize(
    ("stored", "outcome", "warned"),
    [
        (None, "fresh", False),
        (b"this-gpu", "reused", False),
        (b"other-gpu", "replaced", True),
        (b"garbage", "replaced", True),
    ],
)
def test_a_timing_cache_that_does_not_fit_starts_a_fresh_one(tmp_path, stored, outcome, warned):
    path = tmp_path / "cache" / "timing.cache"
    if stored is not None:
        path.parent.mkdir()
        path.write_bytes(stored)
    config, logged = FakeBuilderConfig(), []
    assert use_timing_cache(config, path, logged.append) == outcome
    assert bool(logged) == warned
    assert config.cache is not None
    assert config.cache.data == (b"this-gpu" if outcome == "reused" else b"")
    assert save_timing_cache(config, path, logged.append) == path
    assert path.read_bytes() == config.cache.data + b"+timings"


def test_a_timing_cache_that_cannot_be_saved_is_logged_not_raised(tmp_path):
    config, logged = FakeBuilderConfig(), []
    use_timing_cache(config, tmp_path / "t.cache", logged.append)
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert save_timing_cache(config, blocker / "t.cache", logged.append) is None
    assert len(logged) == 1 and "not saved" in logged[0]


def test_a_shared_timing_cache_that_is_not_writable_is_kept_per_pod(tmp_path):
    config, logged = FakeBuilderConfig(), []
    use_timing_cache(config, tmp_path / "t.cache", logged.append)
    blocker = tmp_path / "read-only-volume"
    blocker.write_text("")  # a file where the folder should be: no write can succeed there
    fallback = tmp_path / "pod" / "t.cache"
    assert save_timing_cache(config, blocker / "t.cache", logged.append, fallback) == fallback
    assert fallback.read_bytes() == config.get_timing_cache().serialize()
    assert "not saved to" in logged[0] and "instead (per pod)" in logged[1]


def test_files_are_replaced_whole(tmp_path):
    path = tmp_path / "model.plan"
    write_atomically(path, b"old")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["model.plan"]


def test_only_the_supported_tensorrt_major_builds_or_loads():
    require_supported_major("10.16.1.11")
    with pytest.raises(EngineContractError, match=r"TensorRT 11\.1\.0 is not supported.*10\.x"):
        require_supported_major("11.1.0")
    with pytest.raises(EngineContractError, match=r"TENSORRT_VERSION in docker-compose\.yml"):
        require_supported_major("11.1.0")
    with pytest.raises(EngineContractError, match="not supported"):
        require_supported_major("8.6.1")
    with pytest.raises(EngineContractError, match=r"gpu_check in it, and add its major"):
        require_supported_major("11.1.0")


def test_a_build_is_strongly_typed_where_tensorrt_has_no_other_form_or_where_asked():
    from python_backend.engines.tensorrt_checks import strongly_typed

    assert not strongly_typed("10.16.1.11", asked=False)
    assert strongly_typed("10.16.1.11", asked=True)
    assert strongly_typed("11.1.0", asked=False) and strongly_typed("12.0", asked=False)


def test_every_captured_size_gets_a_context_of_its_own_and_each_profile_an_eager_one():
    slots = context_slots([(1, 2, 4), (1, 3)], long_rows=True)
    assert slots == [
        ContextSlot(0, None),
        ContextSlot(0, 1),
        ContextSlot(0, 2),
        ContextSlot(0, 4),
        ContextSlot(1, None),
        ContextSlot(1, 1),
        ContextSlot(1, 3),
        ContextSlot(2, None),  # the long-row profile: lengths vary, so no graph
    ]
    # no (profile, size) is served by two contexts, and every profile can run any size eagerly
    captured = [(s.profile, s.batch) for s in slots if s.batch is not None]
    assert len(captured) == len(set(captured))
    assert {s.profile for s in slots if s.batch is None} == {0, 1, 2}
    assert context_slots([()], long_rows=False) == [ContextSlot(0, None)]


def test_a_profile_that_refuses_another_context_falls_back_whichever_way_the_binding_says_so(
    monkeypatch,
):
    """TensorRT's C++ API returns false where a profile takes no further context; its Python
    binding raises RuntimeError instead. Either way the context is not opened (the caller then
    shares the profile's eager context), and the load goes on."""
    from types import SimpleNamespace

    from python_backend.engines import tensorrt_engine
    from python_backend.engines.tensorrt_engine import TensorRTEngine

    strategy = SimpleNamespace(USER_MANAGED=0)  # what TensorRT names it; the stubs here lack it
    monkeypatch.setattr(
        tensorrt_engine.trt, "ExecutionContextAllocationStrategy", strategy, raising=False
    )

    class Context:
        def __init__(self, refusal):
            self.refusal = refusal

        def set_device_memory(self, pointer, size):
            pass

        def set_optimization_profile_async(self, index, stream):
            if isinstance(self.refusal, Exception):
                raise self.refusal
            return self.refusal

        def set_tensor_address(self, name, pointer):
            pass

    buffer = SimpleNamespace(data_ptr=lambda: 0)
    for refusal, opened in ((True, True), (False, False), (RuntimeError("in use"), False)):
        engine = TensorRTEngine.__new__(TensorRTEngine)
        engine.engine = SimpleNamespace(create_execution_context=lambda _s, r=refusal: Context(r))
        engine.activations, engine.activation_bytes = buffer, 0
        engine.stream = SimpleNamespace(cuda_stream=0)
        engine.cuda = SimpleNamespace(inputs={"INPUT_IDS": buffer}, out=buffer)
        engine.output_name = "EMBEDDING"
        assert (engine._open_context(1, batch=4) is not None) is opened


def test_a_forward_is_waited_for_on_a_blocking_event_never_by_spinning_on_the_stream(
    monkeypatch,
):
    """Both GPU engines run forwards through CudaForwards.run: its wait is the event made with
    blocking sync (the thread sleeps until the GPU is done), recorded after the forward and its
    copy back, never the stream's synchronize (which spins a core). CUDA's calls are stand-ins
    here: no GPU on this machine."""
    import contextlib
    from types import SimpleNamespace

    import numpy as np
    import torch

    from python_backend.engines.cuda_graphs import CudaForwards

    calls: list[str] = []

    class Event:
        def __init__(self, blocking=False):
            assert blocking, "a spinning event"

        def record(self, stream):
            calls.append("record")

        def synchronize(self):
            calls.append("event wait")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: contextlib.nullcontext())
    forwards = CudaForwards.__new__(CudaForwards)
    forwards.done = torch.cuda.Event(blocking=True)
    forwards.stream = SimpleNamespace(synchronize=lambda: calls.append("stream spin"))
    forwards.on_device = lambda: None  # type: ignore[method-assign]
    from python_backend.common.contract import ENGINE_INPUTS

    forwards.input_names = ENGINE_INPUTS
    forwards.inputs = {n: torch.zeros(64, dtype=torch.int64) for n in forwards.input_names}
    forwards.host_inputs = {n: torch.zeros(64, dtype=torch.int64) for n in forwards.input_names}
    forwards.out = torch.zeros(4, 2)
    forwards.host_out = torch.zeros(4, 2)

    def launch():
        calls.append("launch")
        staged = forwards.inputs[ENGINE_INPUTS[0]][:8].view(2, 4)
        forwards.out[:2] = staged.sum(dim=1, keepdim=True).float()

    ids = np.arange(8, dtype=np.int64).reshape(2, 4)
    got = forwards.run(ids, np.ones_like(ids), 2, launch)
    assert calls == ["launch", "record", "event wait"]
    assert got[:, 0].tolist() == [6.0, 22.0]
