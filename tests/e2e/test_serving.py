"""The product's main path, against the real Triton server, over HTTP and gRPC."""

from __future__ import annotations

import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from builder.corpus import corpus_rows
from builder.triton_config import read_config
from python_backend.common.contract import INSTANCE_LABEL
from testkit.prometheus import Sample, samples_of, scrape
from testkit.triton_clients import PROTOCOLS, client, id_inputs, infer, text_inputs
from tests.e2e.conftest import repository_of, start_server

TOLERANCE = 1e-4


def request_spans(rows: int, seed: int) -> list[tuple[int, int]]:
    """Rows 0..rows cut into requests of 1 to 4 rows: (start, end) of each."""
    rng = np.random.default_rng(seed)
    cuts = np.cumsum(rng.integers(1, 5, size=rows))
    cuts = cuts[cuts < rows]
    starts, ends = np.concatenate([[0], cuts]), np.concatenate([cuts, [rows]])
    return list(zip(starts.tolist(), ends.tolist(), strict=True))


def metric_samples(server, name: str, **labels: str) -> list[Sample]:
    return samples_of(scrape(f"http://127.0.0.1:{server.metrics_port}/metrics"), name, **labels)


# the model publishes metrics in batches, at most every 0.25 s (between forwards, or when its
# idle scheduler wakes, every 0.25 s): after this long, everything recorded so far is published
SETTLE_S = 0.8


def total(server, name: str, settle: bool = True, **labels) -> float:
    if settle:
        time.sleep(SETTLE_S)
    return sum(s.value for s in metric_samples(server, name, **labels))


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_single_row_is_embedded_like_the_reference(server, protocol, tokenizer, reference_model):
    text = "Triton plans its own batches."
    embedding, tokens = infer(client(server, protocol), "minilm", text_inputs(protocol, [text]))
    ids = tokenizer.encode([text], truncate=True)
    assert embedding.shape == (1, 384) and tokens.tolist() == [[len(ids[0])]]
    assert np.abs(embedding - reference_model(ids)).max() <= TOLERANCE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_multi_row_requests_match_each_row_computed_alone(
    server, protocol, tokenizer, reference_model
):
    texts = corpus_rows(12, seed=7)
    embedding, tokens = infer(client(server, protocol), "minilm", text_inputs(protocol, texts))
    ids = tokenizer.encode(texts, truncate=True)
    assert tokens[:, 0].tolist() == [len(r) for r in ids]
    assert np.abs(embedding - reference_model(ids)).max() <= TOLERANCE


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_the_torch_engine_serves_what_onnx_runtime_serves(
    server, protocol, tokenizer, reference_model
):
    """The same requests to the model built with the torch engine and with ONNX Runtime: each
    row as the reference computes it alone, and the two engines within 1e-5 of each other."""
    texts = corpus_rows(10, seed=11)
    c = client(server, protocol)
    ids = tokenizer.encode(texts, truncate=True)
    served = {}
    for model in ("minilm_torch", "minilm"):
        served[model], tokens = infer(c, model, text_inputs(protocol, texts))
        assert tokens.ravel().tolist() == [len(row) for row in ids]
    assert np.abs(served["minilm_torch"] - reference_model(ids)).max() <= TOLERANCE
    assert np.abs(served["minilm_torch"] - served["minilm"]).max() <= 1e-5


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_text_and_input_ids_give_the_same_outputs(server, protocol, tokenizer):
    texts = ["short one", "a somewhat longer row of text that lands in another bucket " * 3]
    c = client(server, protocol)
    by_text, _ = infer(c, "minilm", text_inputs(protocol, texts))
    by_ids, _ = infer(c, "minilm", id_inputs(protocol, tokenizer.encode(texts, truncate=True)))
    assert np.abs(by_text - by_ids).max() <= 1e-6
    # without a mask every id is a real token: a single row needs none
    alone, _ = infer(
        c, "minilm", id_inputs(protocol, tokenizer.encode(texts[:1], True), with_mask=False)
    )
    assert np.abs(alone - by_text[:1]).max() <= 1e-6


def test_concurrent_clients_each_get_their_own_rows(server, tokenizer, reference_model):
    texts = corpus_rows(80, seed=11)
    ids = tokenizer.encode(texts, truncate=True)
    expected = reference_model(ids)
    # requests of 1..4 rows, random lengths, alternating protocols
    spans = request_spans(len(texts), seed=5)
    forwards_before = total(server, "planner_forwards_total")
    rows_before = total(server, "planner_rows_total")

    def send(k: int):
        a, b = spans[k]
        protocol = PROTOCOLS[k % 2]
        c = client(server, protocol)
        return k, infer(c, "minilm", text_inputs(protocol, texts[a:b]))

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(send, range(len(spans))))
    for k, (embedding, tokens) in results:
        a, b = spans[k]
        assert tokens[:, 0].tolist() == [len(r) for r in ids[a:b]]
        assert np.abs(embedding - expected[a:b]).max() <= TOLERANCE, f"request {k} got other rows"
    rows = total(server, "planner_rows_total") - rows_before
    forwards = total(server, "planner_forwards_total") - forwards_before
    assert rows == len(texts)
    assert forwards < rows / 3, (
        f"{forwards} forwards for {rows} rows: concurrent rows shared forwards"
    )


def test_metrics_report_tokens_plan_costs_and_latency(server):
    infer(client(server, "http"), "minilm", text_inputs("http", ["metrics please"]))
    time.sleep(SETTLE_S)
    real = sum(s.value for s in metric_samples(server, "planner_tokens_total", kind="real"))
    padded = sum(s.value for s in metric_samples(server, "planner_tokens_total", kind="padded"))
    assert 0 < real <= padded
    planned = total(server, "planner_plan_cost_total", plan="planned")
    baseline = total(server, "planner_plan_cost_total", plan="per_bucket")
    assert 0 < planned <= baseline * (1 + 1e-9)
    assert total(server, "planner_forward_seconds_count") >= 1
    # each model instance publishes its own queue depth (one per GPU on a node)
    depth = metric_samples(server, "planner_queue_rows", model="minilm")
    assert any(s.labels[INSTANCE_LABEL].startswith("minilm_0") for s in depth), depth


def test_stopping_the_server_leaves_no_stray_processes(repository, tmp_path):
    own = start_server(repository_of(repository, ("minilm",), tmp_path), tmp_path / "stop.log")
    try:
        infer(client(own, "http"), "minilm", text_inputs("http", ["one request before stopping"]))
        pid = own.process.pid
        # each stub's command line names its server's pid
        stubs = [p for p in _processes() if "triton_python_backend_stub" in p and f" {pid} " in p]
        configs = [d / "config.pbtxt" for d in own.repository.iterdir()]
        instances = sum(
            group.count
            for path in configs
            if path.is_file()
            for group in read_config(path).instance_group
        )
        assert len(stubs) == instances, stubs  # one per model instance in the repository
    finally:
        code = own.stop()
    assert code == 0, f"tritonserver exited with {code}"
    left = [p for p in _processes() if f" {pid} " in p or p.lstrip().startswith(f"{pid} ")]
    assert not left, f"left running: {left}"


def _processes() -> list[str]:
    out = subprocess.run(["ps", "-eww", "-o", "pid,args"], capture_output=True, text=True).stdout
    return out.splitlines()[1:]


def test_a_broken_manifest_fails_model_load_naming_the_field(repository, tmp_path):
    import json
    import shutil

    broken = tmp_path / "repository"
    shutil.copytree(repository / "minilm", broken / "minilm", symlinks=True)
    manifest = broken / "minilm" / "1" / "manifest.json"
    data = json.loads(manifest.read_text())
    del data["family"]
    manifest.unlink()  # a copy, never the shared file behind a link
    manifest.write_text(json.dumps(data))
    log = tmp_path / "broken.log"
    with pytest.raises(RuntimeError, match="tritonserver exited"):
        start_server(broken, log)
    assert "manifest field 'family' is missing" in log.read_text()


def test_a_classifier_names_its_classes_through_tritons_classification_extension(server):
    import tritonclient.http as httpclient

    c = client(server, "http")
    rows = ["a good day", "a bad day"]
    logits = c.infer("classifier", text_inputs("http", rows)).as_numpy("LOGITS")
    top = c.infer(
        "classifier",
        text_inputs("http", rows),
        outputs=[httpclient.InferRequestedOutput("LOGITS", class_count=2)],
    ).as_numpy("LOGITS")
    names = ["negative", "neutral", "positive"]
    for r in range(len(rows)):
        order = np.argsort(-logits[r])[:2]
        got = [entry.decode().split(":") for entry in top[r]]
        assert [int(i) for _, i, _ in got] == order.tolist()
        assert [name for *_, name in got] == [names[i] for i in order]
        assert np.allclose([float(v) for v, _, _ in got], logits[r][order], atol=1e-5)
