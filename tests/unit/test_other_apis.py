"""TEI's, Cohere's and NIM's request shapes read by the /v1 parsers, errors naming the field as
each API names it, each API's statuses, and /predict's scores against a softmax and a sigmoid
computed by hand."""

from __future__ import annotations

import base64
import math

import numpy as np
import pytest

from openai_api import cohere_v2, tei
from openai_api.errors import WRONG_MODEL, OpenAIError, bad_request, from_triton
from openai_api.protocol import (
    RANKING_NAMES,
    InputLimits,
    named_as_sent,
    parse_embeddings,
    parse_ranking,
    parse_rerank,
    parse_tokenize,
    ranking_response,
)


def test_a_tei_embed_body_reads_as_the_v1_body_it_names():
    body = {"inputs": ["a", "b"], "truncation_direction": "Left", "truncate": True}
    query = parse_embeddings(tei.as_v1(body, "m", "embed", {"normalize": True}))
    assert query.model == "m" and query.texts == ["a", "b"]
    assert query.truncation.parameters() == {"truncate": True, "truncation_side": "left"}
    assert query.normalize is True  # TEI's default
    told = parse_embeddings(
        tei.as_v1({"inputs": "a", "normalize": False}, "m", "embed", {"normalize": True})
    )
    assert told.normalize is False and told.texts == ["a"]
    ids = parse_embeddings(tei.as_v1({"inputs": [[101, 7], [101]]}, "m", "embed"))
    assert ids.token_rows == [[101, 7], [101]]


def test_a_tei_rerank_body_reads_texts_and_return_text():
    query = parse_rerank(
        tei.as_v1({"query": "q", "texts": ["x", "y"], "return_text": True}, "m", "rerank")
    )
    assert query.documents == ["x", "y"] and query.return_documents and not query.raw_scores


@pytest.mark.parametrize(
    ("route", "body", "param", "words"),
    [
        ("embed", {"inputs": ["a", 1]}, "inputs", "`inputs` must be"),
        ("embed", {"inputs": ["a", ""]}, "inputs", "`inputs[1]` is an empty string"),
        ("embed", {"inputs": "a", "truncation_direction": "up"}, "truncation_direction", "`truncation_direction` must"),
        ("embed", {"inputs": "a", "prompt_name": 5}, "prompt_name", "`prompt_name` must"),
        ("rerank", {"query": "q"}, "texts", "`texts` must be a non-empty list"),
        ("rerank", {"query": "q", "texts": ["d"], "return_text": 1}, "return_text", "`return_text` must"),
        ("tokenize", {"inputs": 5}, "inputs", "`inputs` must"),
    ],
)  # fmt: skip
def test_an_error_names_the_field_as_tei_spells_it(route, body, param, words):
    parse = {"embed": parse_embeddings, "rerank": parse_rerank, "tokenize": parse_tokenize}[route]
    with pytest.raises(OpenAIError) as err, tei.named_as_sent(route):
        parse(tei.as_v1(body, "m", route))
    assert err.value.param == param and words in err.value.message, err.value.message
    status, answer = tei.error(err.value)
    assert status == 422 and answer == {"error": err.value.message, "error_type": "Validation"}


def test_only_the_reported_field_is_renamed_and_fields_of_other_apis_are_left_out():
    with pytest.raises(OpenAIError) as err, tei.named_as_sent("embed"):
        raise OpenAIError(404, "The model `input` does not exist", param="model")
    assert err.value.message == "The model `input` does not exist"
    body = tei.as_v1({"inputs": "a", "embedding_type": "int8", "input_type": "query"}, "m", "embed")
    assert body == {"input": "a", "model": "m"}


def test_a_deeply_nested_value_is_refused_by_its_kind():
    deep: object = "x"
    for _ in range(3000):
        deep = [deep]
    with pytest.raises(OpenAIError) as err:
        parse_embeddings({"model": "m", "input": "a", "truncation_side": deep})
    assert "got a list" in err.value.message and len(err.value.message) < 200
    with pytest.raises(OpenAIError) as err:
        parse_embeddings({"model": "m", "input": "a", "input_type": "x" * 10**6})
    assert len(err.value.message) < 200


def test_a_body_that_is_not_an_object_is_refused():
    with pytest.raises(OpenAIError, match="JSON object"):
        tei.as_v1(["a"], "m", "embed")


@pytest.mark.parametrize(
    ("err", "status", "kind"),
    [
        (bad_request("`inputs` must be"), 422, "Validation"),
        (bad_request("`texts` must be a non-empty list", code="empty"), 400, "Empty"),
        (bad_request("model `m` is not a reranker", code=WRONG_MODEL), 424, "Backend"),
        (from_triton("StatusCode.UNAVAILABLE", "queue full: 9 rows queued"), 429, "Overloaded"),
        (from_triton("StatusCode.UNAVAILABLE", "failed to connect"), 503, "Unhealthy"),
        (from_triton("StatusCode.INTERNAL", "engine failed"), 424, "Backend"),
        (from_triton("StatusCode.DEADLINE_EXCEEDED", "too late"), 504, "Backend"),
        (from_triton("StatusCode.NOT_FOUND", "no model"), 404, "Validation"),
        (OpenAIError(503, "starting", kind="server_error"), 503, "Unhealthy"),
    ],
)
def test_errors_answer_with_teis_status_and_type(err, status, kind):
    assert tei.error(err) == (status, {"error": err.message, "error_type": kind})


def softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(x - top) for x in row]
    return [x / sum(e) for x in e]


def test_predictions_are_softmax_for_several_classes_sigmoid_for_one_best_first():
    logits = np.array([[0.5, 2.0, -1.0], [3.0, 0.0, 0.0]], dtype=np.float32)
    got = tei.predictions(logits, ("neg", "pos"), raw_scores=False, single=False)
    for row, answer in zip(logits.tolist(), got, strict=True):
        expected = softmax(row)
        order = sorted(range(3), key=lambda c: -expected[c])
        assert [p["label"] for p in answer] == [("neg", "pos", "LABEL_2")[c] for c in order]
        assert np.allclose([p["score"] for p in answer], [expected[c] for c in order])
    one = tei.predictions(np.array([[1.5]], dtype=np.float32), (), False, single=True)
    assert one == [{"label": "LABEL_0", "score": pytest.approx(1 / (1 + math.exp(-1.5)))}]
    raw = tei.predictions(logits[:1], (), raw_scores=True, single=True)
    assert [p["score"] for p in raw] == pytest.approx([2.0, 0.5, -1.0])


@pytest.mark.parametrize(
    ("inputs", "rows", "single"),
    [
        ("a", [("a",)], True),
        (["q", "d"], [("q", "d")], True),
        (["a"], [("a",)], True),
        ([["a"], ["b"]], [("a",), ("b",)], False),
        ([["q", "d"], ["q2", "e"]], [("q", "d"), ("q2", "e")], False),
    ],
)
def test_predict_takes_a_text_a_pair_or_a_batch_of_them(inputs, rows, single):
    got = tei.parse_predict({"inputs": inputs}, 8, InputLimits())
    assert got.rows == rows and got.single == single and got.pairs == (len(rows[0]) == 2)


@pytest.mark.parametrize(
    ("inputs", "words"),
    [
        (None, "`inputs` must be"),
        ([], "`inputs` must be"),
        (["a", "b", "c"], "`inputs` must be"),
        ([["a"], ["q", "d"]], "mixes texts and pairs"),
        ([["a", "b", "c"]], "`inputs[0]`"),
        ([["a"], [1]], "`inputs[1]`"),
        ([["a"], [" "]], "`inputs[1][0]` is an empty string"),
        ([["a"]] * 9, "at most 8"),
        ("x" * 300_000, "bytes; at most"),
    ],
)
def test_predict_refuses_other_shapes_naming_inputs(inputs, words):
    with pytest.raises(OpenAIError) as err:
        tei.parse_predict({"inputs": inputs}, 8, InputLimits())
    assert err.value.param == "inputs" and words in err.value.message, err.value.message


def test_tei_routes_are_told_apart_from_v1():
    assert tei.is_tei("/") and tei.is_tei("/embed") and tei.is_tei("/models/m/rerank")
    assert not tei.is_tei("/v1/embeddings") and not tei.is_tei("/health")


# -- Cohere's v2 bodies and NIM's ranking, read by the same parsers ------------------------------


def test_a_cohere_embed_body_reads_as_v1_with_its_own_options():
    body = {
        "model": "m",
        "texts": ["a", "b"],
        "input_type": "search_document",
        "embedding_types": ["int8", "float", "int8"],
        "truncate": "START",
        "output_dimension": 64,
        "priority": 0,
    }
    query = parse_embeddings(cohere_v2.as_v1(body, "embed"))
    assert query.texts == ["a", "b"] and query.dimensions == 64 and query.priority == 1
    assert query.truncation.parameters() == {"truncate": True, "truncation_side": "left"}
    assert query.prompt_name is None  # Cohere's input_type is not NIM's
    types, prompt = cohere_v2.embed_options(body, {"query", "passage"})
    assert types == ("int8", "float") and prompt == "passage"
    assert cohere_v2.embed_options({"input_type": "search_query"}, ()) == (("float",), None)


@pytest.mark.parametrize(
    ("route", "body", "param", "words"),
    [
        ("embed", {"model": "m", "texts": []}, "texts", "`texts` must be"),
        ("embed", {"model": "m", "texts": ["a"], "output_dimension": 0}, "output_dimension", "`output_dimension` must"),
        ("embed", {"model": "m", "texts": ["a"], "images": ["data:"]}, "images", "`images`"),
        ("embed", {"model": "m", "texts": ["a"], "max_tokens": 8}, "max_tokens", "`max_tokens`"),
        ("embed", {"model": "m", "texts": ["a"], "priority": -1}, "priority", "`priority` must"),
        ("rerank", {"model": "m", "query": "q", "documents": [""]}, "documents", "`documents[0]`"),
    ],
)  # fmt: skip
def test_a_cohere_error_names_the_field_as_sent(route, body, param, words):
    parse = {"embed": parse_embeddings, "rerank": parse_rerank}[route]
    with pytest.raises(OpenAIError) as err, cohere_v2.named_as_sent(route):
        parse(cohere_v2.as_v1(body, route))
    assert err.value.param == param and words in err.value.message, err.value.message
    assert cohere_v2.error(err.value) == (400, {"message": err.value.message})


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"embedding_types": "float"}, "embedding_types"),
        ({"embedding_types": []}, "embedding_types"),
        ({"embedding_types": ["int4"]}, "embedding_types"),
        ({"input_type": "image"}, "input_type"),
    ],
)
def test_cohere_embed_options_are_checked(body, param):
    with pytest.raises(OpenAIError) as err:
        cohere_v2.embed_options(body, ())
    assert err.value.param == param


def test_a_full_queue_is_coheres_429_and_base64_is_little_endian_float32():
    assert cohere_v2.error(from_triton("StatusCode.UNAVAILABLE", "queue full: 9 rows"))[0] == 429
    assert cohere_v2.error(from_triton("StatusCode.UNAVAILABLE", "no connection"))[0] == 503
    vectors = np.array([[1.0, -2.5]], dtype=np.float32)
    answer = cohere_v2.embed_response(["a"], {"base64": vectors, "float": vectors}, 3)
    assert np.frombuffer(base64.b64decode(answer["embeddings"]["base64"][0]), "<f4").tolist() == [
        1.0,
        -2.5,
    ]
    assert answer["meta"]["billed_units"] == {"input_tokens": 3}


def test_a_nim_ranking_body_is_a_rerank_answered_by_logits():
    query = parse_ranking(
        {"model": "m", "query": {"text": "q"}, "passages": [{"text": "x"}, {"text": "y"}]}
    )
    assert query.query == "q" and query.documents == ["x", "y"] and query.raw_scores
    answer = ranking_response(query, np.array([0.5, 2.0], dtype=np.float32), 7)
    assert answer["rankings"] == [{"index": 1, "logit": 2.0}, {"index": 0, "logit": 0.5}]
    with pytest.raises(OpenAIError) as err, named_as_sent(RANKING_NAMES):
        parse_ranking({"model": "m", "query": {"text": "q"}, "passages": [{"text": ""}]})
    assert err.value.param == "passages" and "`passages[0]`" in err.value.message
    with pytest.raises(OpenAIError, match="`query` must be an object"):
        parse_ranking({"model": "m", "query": "q", "passages": [{"text": "x"}]})


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ({"inputs": {"sentences": ["b"]}}, "`inputs.source_sentence` must be"),
        ({"inputs": {"source_sentence": "a", "sentences": []}}, "`inputs.sentences` must be"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b", 3]}}, "`inputs.sentences[1]`"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"] * 8}}, "at most 7"),
        ({"inputs": "a"}, "`inputs.source_sentence`"),
        ({"inputs": {"source_sentence": "a", "sentences": ["b"]}, "parameters": 1}, "`parameters`"),
    ],
)
def test_similarity_refuses_other_shapes_naming_the_field(body, words):
    with pytest.raises(OpenAIError) as err:
        tei.similarity_body(body, "m", InputLimits(), 8)
    assert words in err.value.message, err.value.message


def test_a_similarity_body_embeds_the_source_first_at_unit_length():
    body = tei.similarity_body(
        {"inputs": {"source_sentence": "a", "sentences": ["b", "c"]},
         "parameters": {"truncation_direction": "Left", "prompt_name": "query"}},
        "m", InputLimits(), 8,
    )  # fmt: skip
    query = parse_embeddings(body)
    assert query.texts == ["a", "b", "c"] and query.normalize is True
    assert query.prompt_name == "query" and query.truncation.side == "left"
