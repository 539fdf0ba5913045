"""Client packages nobody here wrote, with their default settings, through the front door with
the API key: LangChain's and LlamaIndex's OpenAI embedders, LlamaIndex's TEI embedder and
reranker, Cohere's v2 client, and NVIDIA aiperf for each endpoint type it names for these routes.
They run from build/clients (`make clients`), a venv of their own; each answer is compared with
what KServe answers for the same inputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.e2e.stack import API_KEY
from tests.e2e.test_openai import DOCUMENTS, QUERY, TEXTS, kserve, kserve_scores

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ROOT / "build" / "clients" / "bin"


@pytest.fixture(scope="module")
def clients() -> Path:
    if not (CLIENTS / "python").exists():
        pytest.fail("the client packages are not installed: run `make clients`")
    return CLIENTS


@pytest.fixture(scope="module")
def answers(stack, clients) -> dict:
    given = {
        "base": f"http://127.0.0.1:{stack.http_port}",
        "key": API_KEY,
        "texts": TEXTS,
        "query": QUERY,
        "documents": DOCUMENTS,
    }
    done = subprocess.run(
        [str(clients / "python"), str(ROOT / "tests" / "clients" / "speak.py")],
        input=json.dumps(given),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "client", ["langchain_openai", "llama_index_openai", "llama_index_tei", "cohere_embed"]
)
def test_each_embedder_gets_kserves_vectors(stack, answers, client):
    expected, _ = kserve(stack, TEXTS)
    got = answers[client]["float"] if client == "cohere_embed" else answers[client]
    got = np.array(got, dtype=np.float32)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-6


def test_coheres_client_reads_packed_bits_usage_and_a_404(stack, answers):
    expected, tokens = kserve(stack, TEXTS)
    cohere = answers["cohere_embed"]
    assert np.array_equal(np.array(cohere["ubinary"]), np.packbits(expected > 0, axis=-1))
    assert cohere["input_tokens"] == int(tokens.sum())
    status, body = answers["cohere_not_found"]
    assert status == 404 and "does not exist" in body["message"]


@pytest.mark.parametrize("client", ["llama_index_tei_rerank", "cohere_rerank"])
def test_each_reranker_gets_the_models_order_and_scores(stack, answers, client):
    scores = 1 / (1 + np.exp(-kserve_scores(stack, QUERY, DOCUMENTS).astype(np.float64)))
    best = np.argsort(-scores, kind="stable")[:2]
    got = answers[client]
    indices = [DOCUMENTS.index(r[0]) if isinstance(r[0], str) else r[0] for r in got]
    assert indices == list(best)
    assert np.abs(np.array([r[1] for r in got]) - scores[best]).max() <= 1e-6


# aiperf's endpoint types for these routes: (type, model, route when not the type's own)
AIPERF = [
    ("embeddings", "minilm", None),
    ("nim_embeddings", "minilm", None),
    ("nim_rankings", "reranker", None),
    ("cohere_rankings", "reranker", None),
    ("hf_tei_rankings", "reranker", "/models/reranker/rerank"),
]


@pytest.mark.parametrize(("endpoint_type", "model", "route"), AIPERF)
def test_aiperf_runs_every_request_without_an_error(
    stack, clients, tmp_path, endpoint_type, model, route
):
    """Sixteen requests at four concurrent, from a file of (query, passages) or texts; aiperf
    counts every one answered and none failed. It tokenizes with the model's own tokenizer."""
    tokenizer = tmp_path / "tokenizer"
    tokenizer.mkdir()
    source = stack.repository / model / "1" / "tokenizer.json"
    (tokenizer / "tokenizer.json").write_bytes(source.read_bytes())
    (tokenizer / "tokenizer_config.json").write_text(
        '{"tokenizer_class": "PreTrainedTokenizerFast"}'
    )
    dataset = tmp_path / "inputs.jsonl"
    rows = []
    for i in range(16):
        if "rankings" in endpoint_type:
            texts = [
                {"name": "query", "contents": [f"{QUERY} {i}"]},
                {"name": "passages", "contents": DOCUMENTS[: 1 + i % len(DOCUMENTS)]},
            ]
            rows.append({"texts": texts})
        else:
            rows.append({"texts": [{"contents": TEXTS[: 1 + i % len(TEXTS)]}]})
    dataset.write_text("".join(json.dumps(r) + "\n" for r in rows))
    artifacts = tmp_path / "artifacts"
    command = [
        str(clients / "aiperf"), "profile",
        "-m", model,
        "--endpoint-type", endpoint_type,
        "--url", f"http://127.0.0.1:{stack.http_port}",
        "--api-key", API_KEY,
        "--tokenizer", str(tokenizer),
        "--input-file", str(dataset),
        "--custom-dataset-type", "single_turn",
        "--request-count", "16",
        "--concurrency", "4",
        "--ui-type", "none",
        "--artifact-dir", str(artifacts),
    ]  # fmt: skip
    if route is not None:
        command += ["--endpoint", route]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    (export,) = artifacts.rglob("profile_export_aiperf.json")
    summary = json.loads(export.read_text())
    assert summary["request_count"]["avg"] == 16, summary.get("request_count")
    assert not summary.get("error_summary"), summary["error_summary"]
