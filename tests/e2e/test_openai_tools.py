"""The routes clients use around embeddings, through the front door with the API key:
``/v1/tokenize`` counts tokens exactly as the model does (prompts, truncation side),
``/v1/decode`` turns ids back into text, ``/v1/info`` states the model's limits, and
``/v1/classify`` answers a classifier's probabilities in vLLM's shape. Every new field of the
wrong type is a 400 naming it, and the server is still right afterwards."""

from __future__ import annotations

import json
import urllib.request

import numpy as np
import pytest

from python_backend.common.manifest import load_manifest
from testkit.triton_clients import client, infer_error, text_inputs
from tests.e2e.stack import API_KEY
from tests.e2e.test_openai import raw

LONG = " ".join(f"word{i}" for i in range(400))  # past MiniLM's 256 tokens
HEADERS = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}


def call(stack, path: str, body: dict | None = None) -> tuple[int, object]:
    return raw(stack, path, None if body is None else json.dumps(body).encode(), HEADERS)


def ok(stack, path: str, body: dict | None = None):
    status, answer = call(stack, path, body)
    assert status == 200, answer
    return answer


def embed(stack, model: str, inputs, **fields) -> tuple[np.ndarray, int]:
    answer = ok(
        stack,
        "/v1/embeddings",
        {"model": model, "input": inputs, "encoding_format": "float", **fields},
    )
    vectors = np.array([d["embedding"] for d in answer["data"]], dtype=np.float32)
    return vectors, answer["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("model", "fields"),
    [
        ("minilm", {}),
        ("minilm", {"truncation_side": "left"}),
        ("minilm_prompts", {"prompt_name": "query"}),
        ("minilm_prompts", {"prompt_name": "query", "truncation_side": "left"}),
    ],
)
def test_tokenize_counts_exactly_the_tokens_the_model_runs(stack, model, fields):
    texts = ["Hello world", LONG]
    rows = ok(stack, "/v1/tokenize", {"model": model, "inputs": texts, **fields})
    ids = [[t["id"] for t in row] for row in rows]
    # usage: the model's own count of the same request
    vectors, tokens = embed(stack, model, texts, **fields)
    assert sum(len(r) for r in ids) == tokens and len(ids[1]) == 256
    # and the very ids: sent back as token ids (taken as already prompted), the same vectors
    from_ids, _ = embed(stack, model, ids)
    assert np.abs(from_ids - vectors).max() <= 1e-6
    hello = rows[0]
    if "prompt_name" not in fields:
        assert [t["text"] for t in hello] == ["[CLS]", "hello", "world", "[SEP]"]
        assert [(t["start"], t["stop"]) for t in hello[1:3]] == [(0, 5), (6, 11)]
    assert hello[0]["special"] and hello[-1]["special"] and hello[0]["start"] is None


def test_tokenize_without_special_tokens_and_without_truncation(stack):
    rows = ok(
        stack,
        "/v1/tokenize",
        {"model": "minilm", "inputs": LONG, "add_special_tokens": False, "truncate": False},
    )
    assert len(rows) == 1 and len(rows[0]) > 256
    assert not any(t["special"] for t in rows[0])
    first = rows[0][0]  # "word0" is "word", "##0"
    assert (first["start"], first["stop"]) == (0, 4) and first["text"] == LONG[0:4] == "word"


def test_tokenize_answers_a_long_untruncated_text_whole_and_refuses_one_past_its_bound(
    stack, tokenizer
):
    text = "!" * 6000  # one token a character: every token answered, each span its own
    (row,) = ok(stack, "/v1/tokenize", {"model": "minilm", "inputs": text, "truncate": False})
    assert [t["id"] for t in row] == tokenizer.encode([text], truncate=False)[0].tolist()
    assert [(t["start"], t["stop"]) for t in row[1:-1]] == [(i, i + 1) for i in range(6000)]
    bound = 250 * 256
    inputs = ["short", "x" * (bound + 1)]
    status, answer = call(stack, "/v1/tokenize", {"model": "minilm", "inputs": inputs})
    assert status == 200, "truncated, any length the body allows is tokenized"
    status, answer = call(
        stack, "/v1/tokenize", {"model": "minilm", "inputs": inputs, "truncate": False}
    )
    assert status == 400 and answer["error"]["param"] == "inputs", answer
    assert f"`inputs[1]` has {bound + 1} characters" in answer["error"]["message"]


def test_decode_turns_ids_back_into_text(stack):
    rows = ok(stack, "/v1/tokenize", {"model": "minilm", "inputs": ["Hello world", "a b"]})
    ids = [[t["id"] for t in row] for row in rows]
    assert ok(stack, "/v1/decode", {"model": "minilm", "ids": ids}) == ["hello world", "a b"]
    assert ok(stack, "/v1/decode", {"model": "minilm", "ids": ids[0]}) == ["hello world"]
    raw = ok(stack, "/v1/decode", {"model": "minilm", "ids": ids[0], "skip_special_tokens": False})
    assert raw == ["[CLS] hello world [SEP]"]


def test_info_states_the_models_limits(stack):
    info = ok(stack, "/v1/info?model=minilm")
    manifest = load_manifest(stack.repository / "minilm" / "1")
    assert info["model_id"] == "minilm" and info["family"] == "embedding"
    assert info["model_type"] == {"embedding": {"pooling": "mean", "dimension": 384}}
    assert info["max_input_length"] == manifest.max_length == 256
    assert info["buckets"] == [b.length for b in manifest.buckets]
    assert info["max_rows_per_request"] == 64 and info["max_client_batch_size"] == 2048
    assert info["max_tokens_per_input"] == 8192 and info["version"]
    assert info["normalize"] is True
    assert np.allclose(info["quantization_ranges"], manifest.quantization_ranges)
    classes = ok(stack, "/v1/info?model=classifier")["model_type"]["classifier"]["id2label"]
    assert classes == {"0": "negative", "1": "neutral", "2": "positive"}
    status, answer = call(stack, "/v1/info")  # several models served: name one
    assert status == 400 and answer["error"]["param"] == "model"
    assert call(stack, "/v1/info?model=nope")[0] == 404


def test_classify_answers_probabilities_and_the_likeliest_class(stack):
    texts = ["what a lovely day", "this is terrible", "the meeting is at noon"]
    answer = ok(stack, "/v1/classify", {"model": "classifier", "input": texts})
    result = client(stack, "http").infer("classifier", text_inputs("http", texts), headers=HEADERS)
    logits, tokens = result.as_numpy("LOGITS"), result.as_numpy("NUM_TOKENS")
    expected = np.exp(logits - logits.max(axis=1, keepdims=True))
    expected /= expected.sum(axis=1, keepdims=True)
    names = ("negative", "neutral", "positive")
    assert [d["index"] for d in answer["data"]] == [0, 1, 2]
    for d, want in zip(answer["data"], expected, strict=True):
        assert d["num_classes"] == 3 and np.abs(np.array(d["probs"]) - want).max() <= 1e-6
        assert d["label"] == names[int(np.argmax(want))]
    assert answer["usage"]["prompt_tokens"] == int(tokens.sum())
    assert answer["object"] == "list" and answer["id"].startswith("classify-")
    status, refused = call(stack, "/v1/classify", {"model": "minilm", "input": "x"})
    assert status == 400 and refused["error"]["param"] == "model"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/tokenize", {"model": "minilm", "inputs": 5}, "inputs"),
        ("/v1/tokenize", {"model": "minilm", "inputs": []}, "inputs"),
        ("/v1/tokenize", {"model": "minilm", "inputs": ["a"] * 2049}, "inputs"),
        ("/v1/tokenize", {"model": "minilm", "inputs": "é" * 140_000}, "inputs"),
        ("/v1/tokenize", {"model": "minilm", "inputs": "a", "add_special_tokens": "no"}, "add_special_tokens"),
        ("/v1/tokenize", {"model": "minilm", "inputs": "a", "truncation_side": "up"}, "truncation_side"),
        ("/v1/tokenize", {"model": "minilm", "inputs": "a", "truncate": "sideways"}, "truncate"),
        ("/v1/tokenize", {"model": "minilm", "inputs": "a", "prompt_name": "summary"}, "prompt_name"),
        ("/v1/tokenize", {"inputs": "a"}, "model"),
        ("/v1/decode", {"model": "minilm", "ids": "101"}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [[101], []]}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [101, 2**40]}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [101, 30522]}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [-1]}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [[1] * 8193]}, "ids"),
        ("/v1/decode", {"model": "minilm", "ids": [1], "skip_special_tokens": 1}, "skip_special_tokens"),
        ("/v1/classify", {"model": "classifier", "input": {"text": "a"}}, "input"),
        ("/v1/classify", {"model": "classifier", "input": [[1], [2**63]]}, "input"),
        ("/v1/classify", {"model": "classifier", "input": "a", "truncate": []}, "truncate"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "embedding_type": "int4"}, "embedding_type"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "embedding_type": ["int8"]}, "embedding_type"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "embedding_type": "int8", "normalize": True}, "embedding_type"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "normalize": "no"}, "normalize"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "truncation_side": 5}, "truncation_side"),
        ("/v1/embeddings", {"model": "minilm", "input": "a", "truncate": "X" * 100_000}, "truncate"),
        ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["d"], "truncation_side": "up"}, "truncation_side"),
    ],
)  # fmt: skip
def test_every_new_field_of_the_wrong_kind_is_a_400_naming_it(stack, path, body, param):
    status, answer = call(stack, path, body)
    assert status == 400, answer
    assert answer["error"]["param"] == param and answer["error"]["message"]
    # and the server still answers right
    assert len(ok(stack, "/v1/tokenize", {"model": "minilm", "inputs": "still here"})[0]) == 4


def test_answers_say_where_their_time_went(stack, server):
    """/v1 answers carry TEI's timing headers (milliseconds: the longest chunk's queue,
    tokenization and inference, and the adapter's own total); KServe answers TIMINGS to a
    request that asks, from the one-process model and from the split layout alike."""
    import time

    body = json.dumps({"model": "minilm", "input": [LONG, "short"]}).encode()
    request = urllib.request.Request(
        f"http://127.0.0.1:{stack.http_port}/v1/embeddings", data=body, headers=HEADERS
    )
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=20) as response:
        headers = {k.lower(): v for k, v in response.headers.items()}
    wall_ms = (time.perf_counter() - started) * 1e3
    times = {
        k: int(headers[f"x-{k}-time"]) for k in ("queue", "tokenization", "inference", "total")
    }
    assert all(t >= 0 for t in times.values()) and times["total"] <= wall_ms + 1
    assert times["queue"] + times["inference"] <= times["total"] + 1
    for model in ("minilm", "minilm_split"):
        texts = ["one", "two rows"]
        c = client(server, "grpc")
        start = time.perf_counter()
        result = c.infer(model, text_inputs("grpc", texts), parameters={"timings": True})
        elapsed = time.perf_counter() - start
        timings = result.as_numpy("TIMINGS")
        assert timings.shape == (2, 3) and np.array_equal(timings[0], timings[1]), model
        queue, tokenization, inference = timings[0]
        assert min(queue, tokenization) >= 0 and inference > 0, model
        assert queue + tokenization + inference <= elapsed, model
        plain = c.infer(model, text_inputs("grpc", texts))
        assert plain.as_numpy("TIMINGS") is None  # only when asked


@pytest.mark.parametrize(
    ("parameters", "words"),
    [
        ({"timings": "yes"}, "parameter timings must be a bool"),
        ({"normalize": 1}, "parameter normalize must be a bool"),
        ({"instruction": 5}, "parameter instruction must be a string"),
        ({"instruction": "judge"}, "parameter instruction is for decoder rerankers"),
        ({"truncation_side": "x" * 10_000}, "parameter truncation_side must be one of right, left"),
    ],
)
def test_kserve_parameters_of_the_wrong_kind_are_refused_naming_them(stack, parameters, words):
    headers = {"authorization": HEADERS["authorization"]}
    c = client(stack, "http")
    refused = infer_error(c, "minilm", text_inputs("http", ["a row"]), parameters, headers=headers)
    assert words in refused.message() and len(refused.message()) < 400
    result = c.infer("minilm", text_inputs("http", ["a row"]), headers=headers)
    assert result.as_numpy("EMBEDDING").shape == (1, 384)  # and the server still answers


# every field each /v1 route reads, beside a valid body for it
ROUTE_FIELDS = {
    "/v1/embeddings": (
        {"model": "minilm", "input": "a"},
        ("model", "input", "encoding_format", "dimensions", "normalize", "embedding_type",
         "prompt_name", "input_type", "truncation_side", "truncate", "priority"),
    ),
    "/v1/rerank": (
        {"model": "reranker", "query": "q", "documents": ["d"]},
        ("model", "query", "documents", "top_n", "return_documents", "raw_scores",
         "truncation_side", "truncate", "priority", "instruction"),
    ),
    "/v1/classify": (
        {"model": "classifier", "input": "a"},
        ("model", "input", "truncation_side", "truncate", "priority"),
    ),
    "/v1/tokenize": (
        {"model": "minilm", "inputs": "a"},
        ("model", "inputs", "add_special_tokens", "prompt_name", "input_type", "truncation_side",
         "truncate"),
    ),
    "/v1/decode": ({"model": "minilm", "ids": [101]}, ("model", "ids", "skip_special_tokens")),
}  # fmt: skip
# values of every JSON kind, and integers past what 64 bits hold
VALUES = [True, 7, -1, 1.5, 2**64, -(2**63) - 1, "", "x", [], [1], ["x"], [[1]], {}, {"a": [1]}]


@pytest.mark.parametrize("path", sorted(ROUTE_FIELDS))
def test_every_field_of_every_route_takes_any_json_value_and_names_itself_when_refused(stack, path):
    """Each field the route reads set, in turn, to a value of each JSON kind: answered, or a 400
    whose message and `param` name that field. Never a 500, never a dropped connection, and the
    same processes serve afterwards."""
    base, fields = ROUTE_FIELDS[path]
    before = stack.server_processes()
    outcomes = set()
    for name in fields:
        for value in VALUES:
            status, answer = call(stack, path, {**base, name: value})
            assert status in (200, 400, 404), (name, value, status, answer)
            if status != 200:  # 404: a model name of the right kind that is not served
                error = answer["error"]  # type: ignore[index]
                assert error["param"] == name, (name, value, error)
                assert status == 404 or f"`{name}" in error["message"], (name, value, error)
            outcomes.add(status)
    assert 400 in outcomes
    assert stack.server_processes() == before, "a process of the deployment was restarted"
    assert len(ok(stack, "/v1/tokenize", {"model": "minilm", "inputs": "still here"})[0]) == 4
