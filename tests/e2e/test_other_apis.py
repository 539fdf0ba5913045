"""text-embeddings-inference's, Cohere's v2 and NIM's ranking routes through the front door with
the API key: vectors, scores and classes equal to what KServe answers for the same inputs, each
API's answer shapes, its error shape and statuses (the door's own refusals included), and
huggingface_hub's InferenceClient pointed at the server as at a TEI endpoint."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError

from testkit.triton_clients import client, text_inputs
from tests.e2e.stack import API_KEY
from tests.e2e.test_openai import DOCUMENTS, QUERY, TEXTS, kserve, kserve_scores, raw
from tests.e2e.test_openai_tools import LONG, VALUES

HEADERS = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}


def call(stack, path: str, body: object = None, headers: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    return raw(stack, path, data, HEADERS if headers is None else headers)


def ok(stack, path: str, body: object = None):
    status, answer = call(stack, path, body)
    assert status == 200, answer
    return answer


def kserve_logits(stack, texts: list[str]) -> np.ndarray:
    """The classifier's logits through KServe v2 infer on the same door."""
    result = client(stack, "http").infer(
        "classifier", text_inputs("http", texts), headers={"authorization": f"Bearer {API_KEY}"}
    )
    return result.as_numpy("LOGITS")


@pytest.mark.parametrize("path", ["/embed", "/", "/models/minilm/embed", "/models/minilm"])
def test_embed_answers_the_default_models_vectors_as_kserve_does(stack, path):
    """The bare routes serve the first model; POST / embeds for an embedding model."""
    expected, _ = kserve(stack, TEXTS)
    got = np.array(ok(stack, path, {"inputs": TEXTS}), dtype=np.float32)
    assert got.shape == expected.shape and np.abs(got - expected).max() <= 1e-6
    one = ok(stack, path, {"inputs": TEXTS[0]})  # a string is a batch of one, as in TEI
    assert np.abs(np.array(one, dtype=np.float32) - expected[:1]).max() <= 1e-6


def test_embed_takes_teis_options(stack):
    """`normalize` false: the pooled vectors, KServe's with normalize off; `truncate` with
    `truncation_direction` Left: the end of a long text, as /v1's truncation_side left; a prompt
    by name, as /v1 applies it."""
    pooled = ok(stack, "/embed", {"inputs": TEXTS, "normalize": False})
    norms = np.linalg.norm(np.array(pooled), axis=1)
    expected, _ = kserve(stack, TEXTS)
    assert np.allclose(np.array(pooled) / norms[:, None], expected, atol=1e-5)
    assert not np.allclose(norms, 1.0, atol=1e-3)
    left = ok(stack, "/embed", {"inputs": [LONG], "truncate": True, "truncation_direction": "Left"})
    v1 = ok(
        stack,
        "/v1/embeddings",
        {"model": "minilm", "input": [LONG], "truncation_side": "left"},
    )
    assert np.abs(np.array(left[0]) - np.array(v1["data"][0]["embedding"])).max() <= 1e-6
    prompted = ok(stack, "/models/minilm_prompts/embed", {"inputs": "x", "prompt_name": "query"})
    v1 = ok(
        stack,
        "/v1/embeddings",
        {"model": "minilm_prompts", "input": "x", "prompt_name": "query"},
    )
    assert np.abs(np.array(prompted[0]) - np.array(v1["data"][0]["embedding"])).max() <= 1e-6


@pytest.mark.parametrize("path", ["/models/reranker/rerank", "/models/reranker"])
def test_rerank_ranks_texts_by_the_models_own_score(stack, path):
    logits = kserve_scores(stack, QUERY, DOCUMENTS)
    expected = 1 / (1 + np.exp(-logits.astype(np.float64)))
    ranks = ok(stack, path, {"query": QUERY, "texts": DOCUMENTS})
    assert [r["index"] for r in ranks] == list(np.argsort(-expected, kind="stable"))
    assert np.abs(np.array([r["score"] for r in ranks]) - np.sort(expected)[::-1]).max() <= 1e-6
    assert "text" not in ranks[0]
    raw_ranks = ok(
        stack, path, {"query": QUERY, "texts": DOCUMENTS, "raw_scores": True, "return_text": True}
    )
    best = int(np.argmax(logits))
    assert raw_ranks[0]["index"] == best and raw_ranks[0]["text"] == DOCUMENTS[best]
    assert abs(raw_ranks[0]["score"] - float(logits[best])) <= 1e-5


def test_predict_answers_a_classifiers_classes_best_first(stack):
    texts = ["a fine day", "a terrible day"]
    logits = kserve_logits(stack, texts).astype(np.float64)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    labels = ok(stack, "/models/classifier/info")["model_type"]["classifier"]["id2label"]
    for path in ("/models/classifier/predict", "/models/classifier"):
        batch = ok(stack, path, {"inputs": [[t] for t in texts]})
        for row, answer in zip(probs, batch, strict=True):
            order = np.argsort(-row, kind="stable")
            assert [p["label"] for p in answer] == [labels[str(c)] for c in order]
            assert np.abs(np.array([p["score"] for p in answer]) - row[order]).max() <= 1e-6
        single = ok(stack, path, {"inputs": texts[0], "raw_scores": True})
        assert abs(single[0]["score"] - logits[0].max()) <= 1e-5


def test_predict_scores_a_rerankers_pairs_each_with_its_own_query(stack):
    pairs = [[QUERY, DOCUMENTS[1]], ["bananas", DOCUMENTS[0]]]
    expected = [kserve_scores(stack, q, [d])[0] for q, d in pairs]
    got = ok(stack, "/models/reranker/predict", {"inputs": pairs})
    for logit, answer in zip(expected, got, strict=True):
        assert answer[0]["label"] == "LABEL_0"
        assert abs(answer[0]["score"] - 1 / (1 + np.exp(-float(logit)))) <= 1e-6


def test_similarity_is_the_cosine_of_kserves_vectors_and_invocations_is_post_root(stack):
    vectors, _ = kserve(stack, TEXTS)
    expected = (
        vectors[1:] @ vectors[0] / np.linalg.norm(vectors[1:], axis=1) / np.linalg.norm(vectors[0])
    )
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    got = ok(stack, "/similarity", body)
    assert np.abs(np.array(got) - expected).max() <= 1e-5
    prompted = ok(
        stack, "/models/minilm_prompts/similarity", {**body, "parameters": {"prompt_name": "query"}}
    )
    assert np.abs(np.array(prompted) - expected).max() > 1e-4  # the prompt is applied
    assert ok(stack, "/invocations", {"inputs": TEXTS[:1]}) == ok(
        stack, "/embed", {"inputs": TEXTS[:1]}
    )
    status, answer = call(stack, "/embed_all", {"inputs": "x"})
    assert status == 424 and answer["error_type"] == "Backend" and "/embed_all" in answer["error"]


def test_tokenize_answers_every_token_and_decode_turns_them_back(stack):
    rows = ok(stack, "/tokenize", {"inputs": ["Hello world", LONG]})
    assert [t["text"] for t in rows[0]] == ["[CLS]", "hello", "world", "[SEP]"]
    assert len(rows[1]) > 256  # TEI's tokenize cuts nothing
    ids = [t["id"] for t in rows[0]]
    assert ok(stack, "/decode", {"ids": ids}) == ["hello world"]
    assert ok(stack, "/models/minilm/decode", {"ids": [ids, ids[1:2]]}) == ["hello world", "hello"]


def test_info_states_the_model_in_teis_shape(stack):
    info = ok(stack, "/info")
    assert info["model_id"] == "minilm" and "embedding" in info["model_type"]
    assert info["max_input_length"] == 256 and info["model_dtype"] == "float32"
    reranker = ok(stack, "/models/reranker/info")["model_type"]["reranker"]
    assert reranker == {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}


@pytest.mark.parametrize(
    ("path", "body", "status", "kind", "words"),
    [
        ("/embed", {"inputs": []}, 400, "Empty", "`inputs` must be"),
        ("/embed", {"inputs": [[]]}, 422, "Validation", "`inputs[0]` must be"),
        ("/embed", {"inputs": "x", "truncation_direction": 3}, 422, "Validation", "`truncation_direction`"),
        ("/embed", {"inputs": [LONG * 100], "truncate": False}, 422, "Validation", "`inputs[0]` is"),
        ("/models/minilm/rerank", {"query": "q", "texts": ["d"]}, 424, "Backend", "is not a reranker"),
        ("/models/reranker/rerank", {"query": "q", "texts": []}, 400, "Empty", "`texts`"),
        ("/models/reranker/rerank", {"query": "q", "texts": ["d", LONG], "truncate": False}, 422, "Validation", "`texts[1]` is"),
        ("/models/reranker/predict", {"inputs": [["q", LONG]], "truncate": False}, 422, "Validation", "`inputs[0]` is"),
        ("/tokenize", {"inputs": [LONG] * 300}, 422, "Validation", "at most 300000 a request"),
        ("/models/reranker/rerank", {"query": "q", "texts": ["d"], "return_text": "yes"}, 422, "Validation", "`return_text`"),
        ("/models/classifier/predict", {"inputs": [["q", "d"]]}, 424, "Backend", "not pairs"),
        ("/models/reranker/predict", {"inputs": "q"}, 424, "Backend", "does not classify"),
        ("/models/nope/embed", {"inputs": "x"}, 404, "Validation", "does not exist"),
        ("/embed", [1], 422, "Validation", "JSON object"),
    ],
)  # fmt: skip
def test_errors_have_teis_shape_and_status(stack, path, body, status, kind, words):
    got, answer = call(stack, path, body)
    assert got == status and answer["error_type"] == kind and words in answer["error"], answer


def test_the_front_doors_own_refusals_on_tei_routes_are_tei_shaped(stack):
    status, answer = call(stack, "/embed", {"inputs": "x"}, {"content-type": "application/json"})
    assert status == 401 and answer["error_type"] == "Validation" and "API key" in answer["error"]
    status, answer = call(stack, "/embed", {"inputs": "x" * (2 << 20)})
    assert status == 413 and answer["error_type"] == "Validation"
    status, answer = raw(stack, "/embed", None, HEADERS)  # a GET
    assert status == 405 and answer["error_type"] == "Validation"
    status, answer = call(stack, "/models/minilm/generate", {"inputs": "x"})
    assert status == 404


# every field each TEI route reads, beside a valid body for it
ROUTE_FIELDS = {
    "/embed": (
        {"inputs": "a"},
        ("inputs", "normalize", "truncate", "truncation_direction", "prompt_name", "dimensions",
         "priority"),
    ),
    "/models/reranker/rerank": (
        {"query": "q", "texts": ["d"]},
        ("query", "texts", "truncate", "truncation_direction", "raw_scores", "return_text",
         "instruction"),
    ),
    "/models/qwen3_reranker/rerank": (
        {"query": "q", "texts": ["d"]},
        ("query", "texts", "truncate", "truncation_direction", "instruction"),
    ),
    "/models/classifier/predict": (
        {"inputs": "a"}, ("inputs", "truncate", "truncation_direction", "raw_scores")
    ),
    "/models/reranker/predict": ({"inputs": ["q", "d"]}, ("inputs", "raw_scores", "instruction")),
    "/tokenize": ({"inputs": "a"}, ("inputs", "add_special_tokens", "prompt_name")),
    "/decode": ({"ids": [101]}, ("ids", "skip_special_tokens")),
    "/similarity": ({"inputs": {"source_sentence": "a", "sentences": ["b"]}}, ("inputs", "parameters")),
    "/v2/embed": (
        {"model": "minilm", "texts": ["a"]},
        ("model", "texts", "input_type", "embedding_types", "truncate", "output_dimension",
         "priority", "images", "max_tokens"),
    ),
    "/v2/rerank": (
        {"model": "reranker", "query": "q", "documents": ["d"]},
        ("model", "query", "documents", "top_n", "return_documents", "priority", "instruction"),
    ),
    "/v1/ranking": (
        {"model": "reranker", "query": {"text": "q"}, "passages": [{"text": "d"}]},
        ("model", "query", "passages", "truncate", "priority"),
    ),
}  # fmt: skip


def refusal(path: str, answer: dict) -> tuple[str, str]:
    """(the message, the field it names or "") of an error in the route's API's shape."""
    if path.startswith("/v2/"):
        return answer["message"], ""
    if path.startswith("/v1/"):
        return answer["error"]["message"], answer["error"]["param"] or ""
    assert answer["error_type"] in ("Validation", "Backend", "Empty"), answer
    return answer["error"], ""


@pytest.mark.parametrize("path", sorted(ROUTE_FIELDS))
def test_every_field_of_every_route_takes_any_json_value(stack, path):
    """Each field set, in turn, to a value of each JSON kind: answered, or the API's 4xx (TEI's
    422, or 424 for a pair a model does not take; 400 or 404 on Cohere's and NIM's) whose
    message names the field. Never a 500, and the same processes serve afterwards."""
    base, fields = ROUTE_FIELDS[path]
    refused = (400, 404) if path.startswith(("/v1/", "/v2/")) else (422, 424)
    before = stack.server_processes()
    outcomes = set()
    for name in fields:
        for value in VALUES:
            status, answer = call(stack, path, {**base, name: value})
            assert status == 200 or status in refused or (status == 400 and value == []), (
                name,
                value,
                status,
                answer,
            )
            if status != 200:
                message, param = refusal(path, answer)  # type: ignore[arg-type]
                if status in (400, 422):
                    assert f"`{name}" in message and param in ("", name), (name, value, answer)
            outcomes.add(status)
    assert refused[0] in outcomes
    assert stack.server_processes() == before, "a process of the deployment was restarted"
    assert len(ok(stack, "/tokenize", {"inputs": "still here"})[0]) == 4


def test_huggingface_hubs_inference_client_speaks_to_it_as_to_tei(stack):
    """InferenceClient with the server's address as its model: feature_extraction posts to `/`,
    text_classification to `/models/classifier`, each with the API key."""
    base = f"http://127.0.0.1:{stack.http_port}"
    hub = InferenceClient(model=base, token=API_KEY)
    vectors = hub.feature_extraction(TEXTS[1])
    expected, _ = kserve(stack, TEXTS[1:2])
    assert np.abs(np.asarray(vectors, dtype=np.float32) - expected).max() <= 1e-6
    classes = InferenceClient(model=f"{base}/models/classifier", token=API_KEY)
    top = classes.text_classification("a fine day")
    logits = kserve_logits(stack, ["a fine day"])[0].astype(np.float64)
    labels = ok(stack, "/models/classifier/info")["model_type"]["classifier"]["id2label"]
    best = top[0] if isinstance(top, list) else top
    assert best.label == labels[str(int(np.argmax(logits)))]
    with pytest.raises(HfHubHTTPError) as err:
        InferenceClient(model=base, token="wrong").feature_extraction("x")
    assert err.value.response.status_code == 401


# -- Cohere's v2 API and NIM's ranking -----------------------------------------------------------


def test_cohere_embed_answers_every_type_asked_from_one_forward(stack):
    """float: KServe's vectors; base64: their float32 bytes; the quantized types: what /v1's
    embedding_type answers for the same texts (checked there against sentence-transformers)."""
    types = ["float", "base64", "int8", "uint8", "binary", "ubinary"]
    answer = ok(
        stack,
        "/v2/embed",
        {"model": "minilm", "texts": TEXTS, "input_type": "search_document",
         "embedding_types": types},
    )  # fmt: skip
    expected, tokens = kserve(stack, TEXTS)
    by_type = answer["embeddings"]
    assert sorted(by_type) == sorted(types) and answer["texts"] == TEXTS
    assert np.abs(np.array(by_type["float"], dtype=np.float32) - expected).max() <= 1e-6
    decoded = np.array([np.frombuffer(base64.b64decode(b), "<f4") for b in by_type["base64"]])
    assert np.array_equal(decoded, np.array(by_type["float"], dtype=np.float32))
    assert answer["meta"]["billed_units"]["input_tokens"] == int(tokens.sum())
    for kind in types[2:]:
        v1 = ok(
            stack, "/v1/embeddings", {"model": "minilm", "input": TEXTS, "embedding_type": kind}
        )
        assert by_type[kind] == [d["embedding"] for d in v1["data"]], kind


def test_cohere_input_type_picks_the_models_prompt(stack):
    answer = ok(
        stack,
        "/v2/embed",
        {"model": "minilm_prompts", "texts": ["x"], "input_type": "search_query"},
    )
    v1 = ok(
        stack, "/v1/embeddings", {"model": "minilm_prompts", "input": "x", "prompt_name": "query"}
    )
    bare = ok(stack, "/v1/embeddings", {"model": "minilm_prompts", "input": "x"})
    got = np.array(answer["embeddings"]["float"][0])
    assert np.abs(got - np.array(v1["data"][0]["embedding"])).max() <= 1e-6
    assert np.abs(got - np.array(bare["data"][0]["embedding"])).max() > 1e-3


def test_cohere_rerank_and_nim_ranking_score_as_the_model_does(stack):
    logits = kserve_scores(stack, QUERY, DOCUMENTS).astype(np.float64)
    order = list(np.argsort(-logits, kind="stable"))
    cohere = ok(
        stack,
        "/v2/rerank",
        {"model": "reranker", "query": QUERY, "documents": DOCUMENTS, "top_n": 2,
         "return_documents": True},
    )  # fmt: skip
    assert [r["index"] for r in cohere["results"]] == order[:2]
    first = cohere["results"][0]
    assert abs(first["relevance_score"] - 1 / (1 + np.exp(-logits[order[0]]))) <= 1e-6
    assert first["document"] == {"text": DOCUMENTS[order[0]]}
    nim = ok(
        stack,
        "/v1/ranking",
        {"model": "reranker", "query": {"text": QUERY},
         "passages": [{"text": d} for d in DOCUMENTS], "truncate": "END"},
    )  # fmt: skip
    assert [r["index"] for r in nim["rankings"]] == order
    assert np.abs(np.array([r["logit"] for r in nim["rankings"]]) - logits[order]).max() <= 1e-5


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        ("/v2/embed", {"model": "minilm", "texts": ["a"], "embedding_types": ["int4"]}, 400, "`embedding_types`"),
        ("/v2/embed", {"model": "minilm", "texts": [[101, 102]]}, 400, "`texts`"),
        ("/v2/embed", {"model": "reranker", "texts": ["a"]}, 400, "does not serve embeddings"),
        ("/v2/embed", {"model": "nope", "texts": ["a"]}, 404, "does not exist"),
        ("/v2/rerank", {"model": "reranker", "query": "q", "documents": []}, 400, "`documents`"),
    ],
)  # fmt: skip
def test_cohere_errors_have_coheres_shape(stack, path, body, status, words):
    got, answer = call(stack, path, body)
    assert got == status and list(answer) == ["message"] and words in answer["message"], answer


def test_the_doors_refusals_on_coheres_routes_are_cohere_shaped_and_kserve_still_answers(stack):
    status, answer = call(stack, "/v2/embed", {"model": "minilm", "texts": ["x"]}, {})
    assert status == 401 and list(answer) == ["message"]
    status, answer = raw(stack, "/v2/rerank", None, HEADERS)  # a GET
    assert status == 405 and list(answer) == ["message"]
    expected, _ = kserve(stack, TEXTS[:1])  # KServe's /v2 beside Cohere's
    assert expected.shape == (1, 384)
    status, answer = call(stack, "/v1/ranking", {"model": "reranker", "query": "q"})
    assert status == 400 and answer["error"]["param"] == "query"
