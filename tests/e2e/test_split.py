"""The split layout on the real Triton server: two front instances decode and answer, one queue
owner plans and runs every row (python_backend/split_models.py)."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from builder.corpus import corpus_rows
from python_backend.common.contract import CLASS_PARAMETER
from testkit.triton_clients import PROTOCOLS, client, infer, infer_error, text_inputs
from tests.e2e.test_serving import TOLERANCE, metric_samples, request_spans, total

MODEL = "minilm_split"


def test_concurrent_requests_through_both_fronts_get_their_own_rows(
    server, tokenizer, reference_model
):
    texts = corpus_rows(80, seed=23)
    ids = tokenizer.encode(texts, truncate=True)
    expected = reference_model(ids)
    spans = request_spans(len(texts), seed=9)
    forwards_before = total(server, "planner_forwards_total", model=MODEL)

    def send(k: int):
        a, b = spans[k]
        protocol = PROTOCOLS[k % 2]
        return k, infer(client(server, protocol), MODEL, text_inputs(protocol, texts[a:b]))

    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(send, range(len(spans))))
    for k, (embedding, tokens) in results:
        a, b = spans[k]
        assert tokens[:, 0].tolist() == [len(r) for r in ids[a:b]]
        assert np.abs(embedding - expected[a:b]).max() <= TOLERANCE, f"request {k} got other rows"
    # both fronts took requests, and the one owner ran every row: its forwards are shared
    # across the fronts' requests
    forwards = total(server, "planner_forwards_total", model=MODEL) - forwards_before
    assert forwards < len(texts) / 3
    owners = {
        s.labels["model_instance"]
        for s in metric_samples(server, "planner_forwards_total", model=MODEL)
    }
    assert owners == {"minilm_split_owner_0_0"}, owners


def test_both_classes_cross_from_the_fronts_to_the_owner_each_row_answered(
    server, tokenizer, reference_model
):
    """Requests of two classes through both fronts, the class as the body check hands it on:
    each answered with its own rows, and the owner counts each class's rows."""
    texts = corpus_rows(60, seed=31)
    ids = tokenizer.encode(texts, truncate=True)
    expected = reference_model(ids)
    spans = request_spans(len(texts), seed=5)

    def counted() -> dict[str, float]:
        name = "planner_class_rows_total"
        return {c: total(server, name, model=MODEL, **{"class": c}) for c in ("1", "2")}

    def send(k: int):
        a, b = spans[k]
        protocol = PROTOCOLS[k % 2]
        parameters = {CLASS_PARAMETER: 2} if k % 3 else None
        inputs = text_inputs(protocol, texts[a:b])
        return k, infer(client(server, protocol), MODEL, inputs, parameters=parameters)

    before = counted()
    with ThreadPoolExecutor(12) as pool:
        results = list(pool.map(send, range(len(spans))))
    for k, (embedding, _) in results:
        a, b = spans[k]
        assert np.abs(embedding - expected[a:b]).max() <= TOLERANCE, f"request {k} got other rows"
    after = counted()
    rows = {
        c: sum(b - a for k, (a, b) in enumerate(spans) if (k % 3 > 0) == (c == "2"))
        for c in ("1", "2")
    }
    assert {c: after[c] - before[c] for c in after} == rows


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_bad_request_is_refused_by_the_front_with_its_reason(server, protocol):
    error = infer_error(client(server, protocol), MODEL, text_inputs(protocol, ["fine", ""]))
    assert "row 1" in str(error) and "empty" in str(error).lower()


def test_the_owner_refuses_a_request_sent_to_it(server):
    error = infer_error(client(server, "http"), "minilm_split_owner", [])
    assert "queue owner" in str(error) and "minilm_split_owner" in str(error)


def test_an_owner_that_fails_to_load_fails_its_fronts_at_once_with_its_reason(repository, tmp_path):
    from builder.triton_config import add_split_variant, read_config, write_config
    from tools.triton_server import TritonServer

    own = tmp_path / "repository"
    own.mkdir()
    (own / "minilm").symlink_to(repository / "minilm", target_is_directory=True)
    add_split_variant(own, "minilm", "broken", fronts=1)
    config = read_config(own / "broken_owner" / "config.pbtxt")
    config.parameters["serves"].string_value = "no_such_model"  # its manifest cannot be read
    write_config(config, own / "broken_owner")
    log = tmp_path / "triton.log"
    server = TritonServer.loading_only(own, ("broken", "broken_owner"), log)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match="exited"):
        server.start()
        server.wait_ready(120)
    server.stop()
    text = log.read_text(errors="replace")
    assert "the queue owner failed to start" in text and "no_such_model" in text, text[-3000:]
    assert time.monotonic() - started < 60, "the front did not wait out its whole timeout"


def _cores_of(pid: int) -> set[int]:
    """The cores any thread of process ``pid`` may run on."""
    return {core for mask in _masks_of(pid) for core in mask}


def _masks_of(pid: int) -> list[frozenset[int]]:
    """The cores each thread of process ``pid`` may run on."""
    return [frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{pid}/task")]


def test_pinned_fronts_and_owners_run_on_cores_of_their_own(repository, tmp_path):
    """pin_cores on: a front on the first core (its tokenizer's workers on every core), an owner
    over a GPU-like engine on the last;
    an owner whose engine computes on the CPU stays on every core, and so does a front with
    pin_cores off. Their answers are the same."""
    from bench.harness import add_variant
    from builder.triton_config import add_split_variant, read_config, write_config
    from python_backend.stub.cpu_pinning import core_order
    from tools.serve import child_stubs, stub_model
    from tools.triton_server import TritonServer

    own = tmp_path / "repository"
    own.mkdir()
    (own / "minilm").symlink_to(repository / "minilm", target_is_directory=True)
    add_variant(own, "minilm", "gpu_like", "zero", fronts=1, parameters={"pin_cores": "on"})
    add_split_variant(own, "minilm", "on_cpu", fronts=1, parameters={"pin_cores": "on"})
    front = read_config(own / "on_cpu" / "config.pbtxt")
    front.parameters["pin_cores"].string_value = "off"  # only its owner asks
    write_config(front, own / "on_cpu")
    server = TritonServer.loading_only(
        own, ("gpu_like", "gpu_like_owner", "on_cpu", "on_cpu_owner"), tmp_path / "triton.log"
    )
    server.start()
    try:
        server.wait_ready(180)
        assert server.process is not None
        stubs = {stub_model(pid): pid for pid in child_stubs(server.process.pid)}
        cores = {model: _cores_of(pid) for model, pid in stubs.items()}
        front_threads = _masks_of(stubs["gpu_like"])
        front_main = frozenset(os.sched_getaffinity(stubs["gpu_like"]))
        rows = ["one row", "and a longer row of text"]
        _, pinned_tokens = infer(client(server, "http"), "gpu_like", text_inputs("http", rows))
        _, tokens = infer(client(server, "http"), "on_cpu", text_inputs("http", rows))
    finally:
        server.stop()
    allowed = os.sched_getaffinity(0)
    order = core_order(allowed)
    # the front's own threads on the first core; only the tokenizer's workers (one per core the
    # server may use) float over every core, to tokenize a request of many rows in parallel
    assert front_main == {order[0]}, front_threads
    floating = [mask for mask in front_threads if mask != {order[0]}]
    assert all(mask == allowed for mask in floating), front_threads
    assert len(floating) <= len(allowed) < len(front_threads) - len(floating), front_threads
    if len(order) > 1:
        assert cores["gpu_like_owner"] == {order[-1]}, cores
    assert cores["on_cpu_owner"] == allowed and cores["on_cpu"] == allowed, cores
    assert pinned_tokens.tolist() == tokens.tolist()


def test_an_owner_with_overlapped_forwards_answers_every_row_as_the_reference(
    repository, tmp_path, tokenizer, reference_model
):
    """overlap_forwards on (the default only where the engine runs on a GPU): the owner's ONNX
    Runtime forwards run on its engine thread, and every request still gets its own rows."""
    from builder.triton_config import add_split_variant
    from tools.triton_server import TritonServer

    own = tmp_path / "repository"
    own.mkdir()
    (own / "minilm").symlink_to(repository / "minilm", target_is_directory=True)
    add_split_variant(own, "minilm", "overlapped", fronts=1, parameters={"overlap_forwards": "on"})
    texts = corpus_rows(60, seed=31)
    ids = tokenizer.encode(texts, truncate=True)
    expected = reference_model(ids)
    spans = request_spans(len(texts), seed=5)
    server = TritonServer.loading_only(
        own, ("overlapped", "overlapped_owner"), tmp_path / "triton.log"
    )
    server.start()
    try:
        server.wait_ready(180)

        def send(k: int):
            a, b = spans[k]
            protocol = PROTOCOLS[k % 2]
            return k, infer(
                client(server, protocol), "overlapped", text_inputs(protocol, texts[a:b])
            )

        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(send, range(len(spans))))
        log = (tmp_path / "triton.log").read_text()
    finally:
        server.stop()
    for k, (embedding, tokens) in results:
        a, b = spans[k]
        assert tokens[:, 0].tolist() == [len(r) for r in ids[a:b]]
        assert np.abs(embedding - expected[a:b]).max() <= TOLERANCE, f"request {k} got other rows"
    assert "forwards on an engine thread (overlap_forwards)" in log
