"""The OpenAI adapter's request checks and response shapes, as plain data."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from openai_api.backend import ModelInfo, check_dimensions, model_info_from_config
from openai_api.errors import OpenAIError, from_triton
from openai_api.protocol import (
    MAX_INPUTS,
    embeddings_response,
    parse_embeddings,
    parse_rerank,
    shorten,
)


def test_every_input_form_openai_accepts_is_parsed():
    assert parse_embeddings({"model": "m", "input": "a"}).texts == ["a"]
    assert parse_embeddings({"model": "m", "input": ["a", "b"]}).texts == ["a", "b"]
    assert parse_embeddings({"model": "m", "input": [1, 2, 3]}).token_rows == [[1, 2, 3]]
    query = parse_embeddings({"model": "m", "input": [[1], [2, 3]], "encoding_format": None})
    assert query.token_rows == [[1], [2, 3]] and query.texts is None
    assert query.encoding_format == "float" and query.count == 2
    assert parse_embeddings({"model": "m", "input": "a", "input_type": "passage"}).prompt_name == (
        "passage"
    )
    assert parse_embeddings({"model": "m", "input": "a", "prompt_name": "q"}).prompt_name == "q"


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ([], None, "JSON object"),
        ({"input": "a"}, "model", "`model` is required"),
        ({"model": "m"}, "input", "`input` must be"),
        ({"model": "m", "input": []}, "input", "`input` must be"),
        ({"model": "m", "input": ["a", 1]}, "input", "`input` must be"),
        ({"model": "m", "input": [True, 2]}, "input", "`input` must be"),
        ({"model": "m", "input": [[1], []]}, "input", "`input[1]`"),
        ({"model": "m", "input": [[1], [2.5]]}, "input", "`input[1]`"),
        ({"model": "m", "input": ["a", ""]}, "input", "`input[1]` is an empty string"),
        ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input", f"at most {MAX_INPUTS}"),
        (
            {"model": "m", "input": "a", "encoding_format": "int8"},
            "encoding_format",
            "float, base64",
        ),
        ({"model": "m", "input": "a", "dimensions": 0}, "dimensions", "positive integer"),
        ({"model": "m", "input": "a", "dimensions": "64"}, "dimensions", "positive integer"),
        ({"model": "m", "input": "a", "input_type": "code"}, "input_type", "query, passage"),
        ({"model": "m", "input": "a", "input_type": []}, "input_type", "query, passage"),
        ({"model": "m", "input": [2**63]}, "input", "holds the token id 9223372036854775808"),
        ({"model": "m", "input": [[5], [-1]]}, "input", "`input[1]` holds the token id -1"),
        ({"model": "m", "input": [[1] * 8193]}, "input", "8193 tokens; at most 8192 an input"),
        ({"model": "m", "input": [[1] * 8000] * 40}, "input", "at most 300000 a request"),
        ({"model": "m", "input": ["é" * 200_000]}, "input", "400000 bytes; at most 262144"),
        ({"model": "m", "input": "a", "prompt_name": 5}, "prompt_name", "name of a prompt"),
        (
            {"model": "m", "input": "a", "prompt_name": "query", "input_type": "query"},
            "input_type",
            "not both",
        ),
        ({"model": "m", "input": "a", "truncate": "end"}, "truncate", "END, START, NONE"),
        ({"model": "m", "input": "a", "truncate": 1}, "truncate", "END, START, NONE"),
        ({"model": "m", "input": "a", "normalize": "false"}, "normalize", "true or false"),
        ({"model": "m", "input": "a", "truncate": "X" * 10**6}, "truncate", "END, START"),
        ({"model": "m", "input": "a", "truncation_side": "up"}, "truncation_side", "right, left"),
        ({"model": "m", "input": "a", "truncation_side": 0}, "truncation_side", "right, left"),
        (
            {"model": "m", "input": "a", "truncate": "END", "truncation_side": "left"},
            "truncate",
            "not both",
        ),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field(body, param, words):
    with pytest.raises(OpenAIError) as err:
        parse_embeddings(body)
    assert err.value.status == 400 and err.value.param == param
    assert words in err.value.message
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize(
    ("fields", "parameters"),
    [
        ({}, {}),
        ({"truncation_side": "left"}, {"truncation_side": "left"}),
        ({"truncation_side": "right"}, {"truncation_side": "right"}),
        ({"truncate": "START"}, {"truncate": True, "truncation_side": "left"}),
        ({"truncate": "END"}, {"truncate": True, "truncation_side": "right"}),
        ({"truncate": "NONE"}, {"truncate": False}),
        ({"truncate": False}, {"truncate": False}),  # TEI's form
        (
            {"truncate": True, "truncation_side": "left"},
            {"truncate": True, "truncation_side": "left"},
        ),
    ],
)
def test_truncation_fields_become_the_models_parameters(fields, parameters):
    """NIM's truncate and truncation_side say which end of an over-long input is cut; neither
    leaves the model's default."""
    query = parse_embeddings({"model": "m", "input": "a", **fields})
    assert query.truncation.parameters() == parameters
    rerank = parse_rerank({"model": "m", "query": "q", "documents": ["d"], **fields})
    assert rerank.truncation.parameters() == parameters


def test_base64_is_little_endian_float32_of_the_same_vector():
    vectors = np.array([[0.5, -1.25, 3.0]], dtype=np.float32)
    answer = embeddings_response("m", vectors, "base64", 7)
    packed = answer["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), dtype="<f4"), vectors[0])
    floats = embeddings_response("m", vectors, "float", 7)
    assert floats["data"][0]["embedding"].tolist() == [0.5, -1.25, 3.0]
    assert floats["usage"] == {"prompt_tokens": 7, "total_tokens": 7}


def test_shortened_vectors_are_the_head_at_unit_length():
    rng = np.random.default_rng(0)
    full = rng.normal(size=(4, 16)).astype(np.float32)
    short = shorten(full, 8)
    assert short.shape == (4, 8)
    assert np.allclose(np.linalg.norm(short, axis=1), 1.0, atol=1e-6)
    cos = np.sum(short * full[:, :8], axis=1) / np.linalg.norm(full[:, :8], axis=1)
    assert np.allclose(cos, 1.0, atol=1e-6)


def info(dimensions=()) -> ModelInfo:
    return ModelInfo("m", "EMBEDDING", 384, 64, tuple(dimensions), 0)


def test_dimensions_are_allowed_only_where_the_model_declares_them():
    check_dimensions(info(), None)
    check_dimensions(info(), 384)  # its own size is always fine
    with pytest.raises(OpenAIError, match="does not support"):
        check_dimensions(info(), 128)
    check_dimensions(info((128, 256)), 128)
    with pytest.raises(OpenAIError, match="128, 256, not 100"):
        check_dimensions(info((128, 256)), 100)


def test_the_model_config_says_what_the_adapter_serves():
    config = {
        "name": "m",
        "max_batch_size": 64,
        "output": [{"name": "EMBEDDING", "dims": ["384"]}, {"name": "NUM_TOKENS", "dims": ["1"]}],
        "parameters": {"matryoshka_dimensions": {"string_value": "256, 128,64"}},
    }
    got = model_info_from_config(config, 5)
    assert (got.output_dim, got.max_rows, got.dimensions, got.embeds) == (
        384,
        64,
        (64, 128, 256),
        True,
    )
    config["output"][0] = {"name": "LOGITS", "dims": ["3"]}
    assert not model_info_from_config(config, 5).embeds


@pytest.mark.parametrize(
    ("status", "http"),
    [
        ("StatusCode.INVALID_ARGUMENT", 400),
        ("StatusCode.UNAVAILABLE", 503),
        ("StatusCode.NOT_FOUND", 404),
        ("StatusCode.INTERNAL", 500),
        (None, 500),
    ],
)
def test_triton_failures_map_to_openai_statuses(status, http):
    err = from_triton(status, "boom", "inputs 0..3: ")
    assert err.status == http
    assert err.message == ("inputs 0..3: boom" if http == 400 else "boom")


def test_a_request_parameter_the_model_refused_is_named_as_its_field():
    message = "parameter prompt_name 'x' is not a prompt of this model (its prompts: none)"
    err = from_triton("StatusCode.INVALID_ARGUMENT", message, "inputs 0..3: ")
    assert (err.status, err.param) == (400, "prompt_name")
    assert (
        err.message
        == "inputs 0..3: `prompt_name` 'x' is not a prompt of this model (its prompts: none)"
    )
    # a refusal that names no parameter keeps its words and names no field
    assert from_triton("StatusCode.INVALID_ARGUMENT", "TEXT row 0 is empty").param is None


def test_rerank_requests_in_tei_and_cohere_shapes():
    from openai_api.protocol import parse_rerank

    tei = parse_rerank({"model": "r", "query": "q", "texts": ["a", "b"], "raw_scores": True})
    cohere = parse_rerank(
        {"model": "r", "query": "q", "documents": [{"text": "a"}, "b"], "top_n": 1}
    )
    assert tei.documents == cohere.documents == ["a", "b"]
    assert tei.raw_scores and not cohere.raw_scores and cohere.top_n == 1
    for body, param in (
        ({"model": "r", "query": "q", "texts": ["a"], "documents": ["a"]}, "documents"),
        ({"model": "r", "query": "q", "documents": [{"title": "a"}]}, "documents"),
        (
            {"model": "r", "query": "q", "documents": ["a"], "return_documents": "yes"},
            "return_documents",
        ),
        ({"model": "r", "documents": ["a"]}, "query"),
    ):
        with pytest.raises(OpenAIError) as err:
            parse_rerank(body)
        assert err.value.status == 400 and err.value.param == param


def test_rerank_texts_are_held_to_the_text_input_cap():
    from openai_api.protocol import InputLimits, parse_rerank

    limits = InputLimits(max_tokens_per_input=4)  # 128 bytes a text
    for body, param in (
        ({"model": "r", "query": "q" * 129, "documents": ["a"]}, "query"),
        ({"model": "r", "query": "q", "documents": ["a", "d" * 129]}, "documents"),
    ):
        with pytest.raises(OpenAIError, match="129 bytes; at most 128") as err:
            parse_rerank(body, limits)
        assert err.value.param == param
    assert parse_rerank({"model": "r", "query": "q" * 128, "documents": ["a"]}, limits)


def test_rerank_results_are_sorted_best_first_with_their_indices():
    from openai_api.protocol import parse_rerank, rerank_response

    query = parse_rerank(
        {"model": "r", "query": "q", "documents": ["a", "b", "c"], "return_documents": True}
    )
    answer = rerank_response(query, np.array([0.0, 2.0, -1.0], dtype=np.float32), 9)
    assert [r["index"] for r in answer["results"]] == [1, 0, 2]
    assert answer["results"][0]["document"] == {"text": "b"}
    assert abs(answer["results"][0]["relevance_score"] - 1 / (1 + np.exp(-2.0))) < 1e-9
    assert answer["results"][1]["relevance_score"] == 0.5
    top = rerank_response(
        parse_rerank(
            {
                "model": "r",
                "query": "q",
                "documents": ["a", "b", "c"],
                "top_n": 1,
                "raw_scores": True,
            }
        ),
        np.array([0.0, 2.0, -1.0], dtype=np.float32),
        9,
    )
    assert [(r["index"], r["relevance_score"]) for r in top["results"]] == [(1, 2.0)]


def test_the_caps_are_settings_and_a_text_just_under_them_passes():
    from openai_api.protocol import InputLimits

    tight = InputLimits(max_tokens_per_input=4, max_tokens_per_request=6)
    with pytest.raises(OpenAIError, match="at most 6 a request"):
        parse_embeddings({"model": "m", "input": [[1, 2, 3], [4, 5, 6, 7]]}, tight)
    assert parse_embeddings({"model": "m", "input": [[1, 2, 3], [4, 5, 6]]}, tight).count == 2
    at_cap = "x" * tight.max_text_bytes_per_input
    assert parse_embeddings({"model": "m", "input": [at_cap]}, tight).count == 1
    with pytest.raises(OpenAIError, match="bytes; at most"):
        parse_embeddings({"model": "m", "input": [at_cap + "x"]}, tight)


def test_an_unexpected_error_is_a_500_without_the_exceptions_text():
    from starlette.testclient import TestClient

    from openai_api.app import create_app

    class Broken:
        async def info(self, name):
            raise RuntimeError("/secret/internal/path")

        async def close(self):
            return None

    with TestClient(create_app(Broken()), raise_server_exceptions=False) as api:  # type: ignore[arg-type]
        answer = api.post("/v1/embeddings", json={"model": "minilm", "input": "hi"})
    assert answer.status_code == 500
    assert "secret" not in answer.text and answer.json()["error"]["type"] == "server_error"


def test_a_failed_chunk_cancels_the_chunks_still_running():
    import asyncio

    from openai_api.backend import gather_or_cancel

    cancelled = []

    async def slow(i):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    async def failing():
        await asyncio.sleep(0.01)
        raise OpenAIError(400, "row 0 is empty")

    async def run():
        with pytest.raises(OpenAIError, match="row 0 is empty"):
            await gather_or_cancel(slow(1), failing(), slow(2))

    asyncio.run(run())
    assert sorted(cancelled) == [1, 2]


def test_work_for_a_client_that_left_is_cancelled():
    import asyncio

    from openai_api.app import ClientGone, unless_disconnected

    class Leaving:
        async def receive(self):
            await asyncio.sleep(0.01)
            return {"type": "http.disconnect"}

    class Staying:
        async def receive(self):
            await asyncio.sleep(10)
            return {"type": "http.disconnect"}

    cancelled = []

    async def work(seconds):
        try:
            await asyncio.sleep(seconds)
        except asyncio.CancelledError:
            cancelled.append(seconds)
            raise
        return "answer"

    async def run():
        with pytest.raises(ClientGone):
            await unless_disconnected(Leaving(), work(10))
        assert await unless_disconnected(Staying(), work(0.01)) == "answer"

    asyncio.run(run())
    assert cancelled == [10]


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"embedding_type": "int4"}, "float, int8, uint8, binary, ubinary"),
        ({"embedding_type": 8}, "float, int8"),
        ({"embedding_type": "int8", "normalize": False}, "without `normalize`"),
        ({"embedding_type": "uint8", "normalize": True}, "without `normalize`"),
    ],
)
def test_a_bad_embedding_type_is_a_400_naming_it(fields, words):
    with pytest.raises(OpenAIError) as err:
        parse_embeddings({"model": "m", "input": "a", **fields})
    assert err.value.param == "embedding_type" and words in err.value.message
    assert parse_embeddings(
        {"model": "m", "input": "a", "embedding_type": "binary", "normalize": False}
    )


def test_token_id_rows_are_sent_longest_first_and_answered_in_input_order(monkeypatch):
    """Each request is padded to its longest row: over several requests, token-id rows are
    grouped by length (long rows together), and the vectors come back in input order; an error
    names the inputs of its request as the client numbered them."""
    import asyncio

    from openai_api.backend import Served, TritonBackend, inputs_named

    backend = TritonBackend("127.0.0.1:1", ["m"])
    sent: list[tuple[list[int], list[int]]] = []

    async def infer(info, rows, as_text, positions, *rest, **kw):
        assert not as_text
        sent.append(([len(r) for r in rows], list(positions)))
        # each row answers its own length and its input index
        outputs = np.array([[len(r), p] for r, p in zip(rows, positions, strict=True)], float)
        return Served(outputs, sum(len(r) for r in rows), (0.0, 0.0, 0.0))

    monkeypatch.setattr(backend, "_infer", infer)
    lengths = [300 if i % 64 == 0 else 1 + i % 5 for i in range(200)]
    rows = [[7] * n for n in lengths]
    info = ModelInfo("m", "EMBEDDING", 2, 64, (), 0)
    served = asyncio.run(backend.embed(info, None, rows))
    assert served.outputs[:, 0].tolist() == lengths  # input order
    assert served.outputs[:, 1].tolist() == list(range(200))
    assert served.tokens == sum(lengths)
    assert sent[0][0][:4] == [300] * 4  # the long rows share one request
    assert [max(s[0]) for s in sent] == sorted((max(s[0]) for s in sent), reverse=True)
    assert sorted(p for _, positions in sent for p in positions) == list(range(200))
    short = asyncio.run(backend.embed(info, None, rows[:64]))  # one request: as sent
    assert sent[-1][1] == list(range(64)) and short.outputs[:, 1].tolist() == list(range(64))
    assert inputs_named([0]) == "" and inputs_named([64, 65, 66]) == "inputs 64..66: "
    assert inputs_named([0, 64, 128]) == "inputs 0, 64, 128: "
    assert inputs_named(list(range(0, 200, 10))).endswith(", ...: ")
