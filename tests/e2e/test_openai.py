"""The OpenAI API at /v1 through the front door, driven by the official `openai` client: the
answers equal KServe's for the same rows, in input order, with usage from the model's own token
counts; errors in OpenAI's shape, with the right status."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from openai_api.protocol import shorten
from testkit.triton_clients import client, infer, infer_error, text_inputs
from tests.e2e.stack import API_KEY

TEXTS = [
    "Triton plans its own batches.",
    "A much longer row, so that the two inputs fall into different length buckets and the "
    "planner has to decide whether they share a forward or not, which it does by cost.",
    "short",
]


@pytest.fixture(scope="module")
def api(stack) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", api_key=API_KEY, max_retries=0
    )


def kserve(stack, texts: list[str], model: str = "minilm") -> tuple[np.ndarray, np.ndarray]:
    """The same rows through KServe v2 on the same front door: (vectors, tokens per row)."""
    headers = {"authorization": f"Bearer {API_KEY}"}
    vectors, tokens = infer(
        client(stack, "http"), model, text_inputs("http", texts), headers=headers
    )
    return vectors, tokens.reshape(-1)


def test_embeddings_equal_kserve_for_the_same_rows_with_usage_from_the_model(stack, api):
    answer = api.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    expected, tokens = kserve(stack, TEXTS)
    assert [d.index for d in answer.data] == [0, 1, 2]
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert np.abs(got - expected).max() <= 1e-6
    assert answer.usage.prompt_tokens == answer.usage.total_tokens == int(tokens.sum())
    assert answer.model == "minilm"


def test_base64_decodes_to_exactly_the_floats(api):
    floats = api.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    packed = api.embeddings.create(model="minilm", input=TEXTS, encoding_format="base64")
    import base64

    for f, p in zip(floats.data, packed.data, strict=True):
        assert isinstance(p.embedding, str)
        decoded = np.frombuffer(base64.b64decode(p.embedding), dtype="<f4")
        assert np.array_equal(decoded, np.array(f.embedding, dtype=np.float32))
    # the client's default asks for base64 and decodes it itself
    default = api.embeddings.create(model="minilm", input=TEXTS)
    assert np.array_equal(
        np.array([d.embedding for d in default.data], dtype=np.float32),
        np.array([d.embedding for d in floats.data], dtype=np.float32),
    )


def test_a_hundred_inputs_come_back_in_order(stack, api):
    texts = [f"input number {i}: " + "word " * (i % 37) for i in range(100)]
    answer = api.embeddings.create(model="minilm", input=texts, encoding_format="float")
    assert [d.index for d in answer.data] == list(range(100))
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    expected = np.concatenate([kserve(stack, texts[a : a + 50])[0] for a in (0, 50)])
    assert np.abs(got - expected).max() <= 1e-6
    assert answer.usage.prompt_tokens == sum(
        int(kserve(stack, texts[a : a + 50])[1].sum()) for a in (0, 50)
    )


def test_token_id_inputs_equal_the_text_they_came_from(stack, tokenizer, api):
    rows = [row.tolist() for row in tokenizer.encode(TEXTS, truncate=True)]
    from_ids = api.embeddings.create(model="minilm", input=rows, encoding_format="float")
    from_text = api.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    a = np.array([d.embedding for d in from_ids.data])
    b = np.array([d.embedding for d in from_text.data])
    assert np.abs(a - b).max() <= 1e-6
    assert from_ids.usage.prompt_tokens == sum(len(r) for r in rows)


def test_token_id_rows_over_several_requests_come_back_in_input_order(stack, tokenizer, api):
    """Over 64 rows the adapter sends token-id rows longest first (a request is padded to its
    longest row); the answers still come in input order, each the vector of its own text."""
    texts = [f"row {i}: " + "word " * (i * 7 % 41) for i in range(150)]
    rows = [row.tolist() for row in tokenizer.encode(texts, truncate=True)]
    from_ids = api.embeddings.create(model="minilm", input=rows, encoding_format="float")
    assert [d.index for d in from_ids.data] == list(range(150))
    got = np.array([d.embedding for d in from_ids.data], dtype=np.float32)
    expected = np.concatenate([kserve(stack, texts[a : a + 50])[0] for a in (0, 50, 100)])
    assert np.abs(got - expected).max() <= 1e-5
    assert from_ids.usage.prompt_tokens == sum(len(r) for r in rows)
    with pytest.raises(openai.BadRequestError) as refused:  # refused in one of its requests
        api.embeddings.create(model="minilm", input=[*rows[:99], [10**6], *rows[100:]])
    assert "inputs " in refused.value.message and "ids must lie in [0, " in refused.value.message


def test_dimensions_shorten_and_renormalise_where_the_model_allows_it(stack, api):
    answer = api.embeddings.create(
        model="minilm_matryoshka", input=TEXTS, dimensions=128, encoding_format="float"
    )
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    full, _ = kserve(stack, TEXTS, model="minilm_matryoshka")
    assert got.shape == (3, 128)
    assert np.abs(got - shorten(full, 128)).max() <= 1e-6
    assert np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm_matryoshka", input="x", dimensions=100)
    assert "128, 256" in refused.value.message
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm", input="x", dimensions=128)
    assert refused.value.body["param"] == "dimensions"


def test_prompts_are_chosen_by_name_or_by_nims_input_type(stack, api):
    texts = ["what is batching", "rows share forwards"]
    expected, _ = kserve(stack, [f"query: {t}" for t in texts], model="minilm_prompts")
    for extra in ({"input_type": "query"}, {"prompt_name": "query"}):
        answer = api.embeddings.create(
            model="minilm_prompts", input=texts, encoding_format="float", extra_body=extra
        )
        got = np.array([d.embedding for d in answer.data], dtype=np.float32)
        assert np.abs(got - expected).max() <= 1e-6, extra
    plain = api.embeddings.create(model="minilm_prompts", input=texts, encoding_format="float")
    assert np.abs(np.array(plain.data[0].embedding) - expected[0]).max() > 1e-3
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm_prompts", input="x", extra_body={"prompt_name": "x"})
    assert "its prompts: passage, query" in refused.value.message


def test_models_are_listed(api):
    assert sorted(m.id for m in api.models.list()) == [
        "classifier",
        "minilm",
        "minilm_matryoshka",
        "minilm_prompts",
        "qwen3_reranker",
        "reranker",
        "tiny_embedder",
    ]
    assert api.models.retrieve("minilm").id == "minilm"


@pytest.mark.parametrize(
    ("call", "error", "status", "code"),
    [
        (lambda api: api.embeddings.create(model="nope", input="x"), openai.NotFoundError, 404, "model_not_found"),
        (lambda api: api.models.retrieve("nope"), openai.NotFoundError, 404, "model_not_found"),
        (lambda api: api.embeddings.create(model="minilm", input=[]), openai.BadRequestError, 400, None),
        (lambda api: api.embeddings.create(model="minilm", input=[""]), openai.BadRequestError, 400, None),
        (
            lambda api: api.embeddings.create(model="minilm", input=[[1, 2], []]),
            openai.BadRequestError,
            400,
            None,
        ),
        (
            lambda api: api.embeddings.create(model="minilm", input="x", encoding_format="int8"),  # type: ignore[arg-type]
            openai.BadRequestError,
            400,
            None,
        ),
    ],
)  # fmt: skip
def test_errors_have_openais_shape_and_status(api, call, error, status, code):
    with pytest.raises(error) as raised:
        call(api)
    assert raised.value.status_code == status
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error" and body["message"]
    if code:
        assert body["code"] == code


def test_the_model_refuses_what_it_cannot_take_with_a_400_naming_the_input(api):
    # blank text passes the adapter's own checks; the model refuses it, naming the row
    with pytest.raises(openai.BadRequestError) as raised:
        api.embeddings.create(model="minilm", input=["fine", "   "])
    assert raised.value.status_code == 400
    assert "row 1 is empty" in raised.value.message


LONG = " ".join(f"word{i}" for i in range(400))  # about 800 tokens: past MiniLM's 256


def test_truncation_side_and_nims_truncate_cut_the_end_they_name(stack, tokenizer, api):
    """Over the model's limit, `truncation_side` left (or NIM's START) keeps the input's end,
    right (END, or neither) its start, each as the model itself cuts token ids; NONE refuses,
    naming the input, its length and the limit. KServe takes the same parameter."""
    whole = tokenizer.encode([LONG], truncate=False)[0]
    limit = tokenizer.max_length
    assert len(whole) > limit
    tail = [int(whole[0]), *whole[-limit + 1 : -1].tolist(), int(whole[-1])]
    head = tokenizer.encode([LONG], truncate=True)[0].tolist()

    def vector(extra: dict, model_input) -> np.ndarray:
        answer = api.embeddings.create(
            model="minilm", input=model_input, encoding_format="float", extra_body=extra
        )
        return np.array([d.embedding for d in answer.data], dtype=np.float32)

    want_tail, want_head = vector({}, [tail])[0], vector({}, [head])[0]
    assert np.abs(want_tail - want_head).max() > 1e-3  # the two ends differ
    for extra, want in (
        ({"truncation_side": "left"}, want_tail),
        ({"truncate": "START"}, want_tail),
        ({"truncation_side": "right"}, want_head),
        ({"truncate": "END"}, want_head),
        ({}, want_head),
    ):
        got = vector(extra, ["short", LONG])
        assert np.abs(got[1] - want).max() <= 1e-6, extra
    # token ids too: left keeps the last ids
    ids_left = vector({"truncation_side": "left"}, [whole[1:-1].tolist()])[0]
    plain_tail = vector({}, [whole[-limit - 1 : -1].tolist()])[0]
    assert np.abs(ids_left - plain_tail).max() <= 1e-6

    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(
            model="minilm", input=["short", LONG], extra_body={"truncate": "NONE"}
        )
    message = refused.value.message
    assert f"`input[1]` is {len(whole)} tokens" in message and f"limit is {limit}" in message
    assert refused.value.body["param"] == "input"

    headers = {"authorization": f"Bearer {API_KEY}"}
    c = client(stack, "http")
    kserve_left, _ = infer(
        c, "minilm", text_inputs("http", [LONG]), {"truncation_side": "left"}, headers=headers
    )
    assert np.abs(kserve_left[0] - want_tail).max() <= 1e-6
    refused_kserve = infer_error(
        c, "minilm", text_inputs("http", [LONG]), {"truncation_side": "middle"}, headers=headers
    )
    assert "truncation_side must be one of right, left" in refused_kserve.message()


def test_normalize_false_answers_the_pooled_vector_on_kserve_and_v1(stack, server, tokenizer, api):
    """The graph returns the pooled vector and the server normalises by default (MiniLM's
    pipeline ends in Normalize): normalize false answers the pooled vector itself, computed here
    by transformers on each row alone; `dimensions` then shortens without renormalising."""
    from builder.build import default_model_dir
    from builder.families import load_model, run_rows_alone

    rows = tokenizer.encode(TEXTS, truncate=True)
    pooled = run_rows_alone(load_model(default_model_dir()), rows)
    assert np.abs(np.linalg.norm(pooled, axis=1) - 1).min() > 0.1  # not unit vectors
    headers = {"authorization": f"Bearer {API_KEY}"}
    got, _ = infer(
        client(stack, "http"),
        "minilm",
        text_inputs("http", TEXTS),
        {"normalize": False},
        headers=headers,
    )
    assert np.abs(got - pooled).max() <= 1e-4  # through the door
    direct, _ = infer(
        client(server, "grpc"), "minilm", text_inputs("grpc", TEXTS), {"normalize": False}
    )
    assert np.abs(direct - pooled).max() <= 1e-4
    answer = api.embeddings.create(
        model="minilm", input=TEXTS, encoding_format="float", extra_body={"normalize": False}
    )
    got = np.array([d.embedding for d in answer.data], dtype=np.float32)
    assert np.abs(got - pooled).max() <= 1e-4
    unit = api.embeddings.create(
        model="minilm", input=TEXTS, encoding_format="float", extra_body={"normalize": True}
    )
    expected = pooled / np.linalg.norm(pooled, axis=1, keepdims=True)
    assert np.abs(np.array([d.embedding for d in unit.data]) - expected).max() <= 1e-5
    short = api.embeddings.create(
        model="minilm_matryoshka",
        input=TEXTS,
        dimensions=128,
        encoding_format="float",
        extra_body={"normalize": False},
    )
    assert np.abs(np.array([d.embedding for d in short.data]) - pooled[:, :128]).max() <= 1e-4
    refused = infer_error(
        client(stack, "http"),
        "classifier",
        text_inputs("http", ["q"]),
        {"normalize": True},
        headers=headers,
    )
    assert "normalize is for embedding models" in refused.message()


@pytest.mark.parametrize("embedding_type", ["int8", "uint8", "binary", "ubinary"])
def test_quantized_vectors_are_sentence_transformers_quantization_of_the_floats(
    stack, api, embedding_type
):
    """With the official client, `encoding_format="float"` (its default, base64, would decode
    the bytes as float32): JSON integers, equal to sentence-transformers' own quantization of the
    float vectors over the ranges the builder calibrated; base64 carries their raw bytes."""
    import base64

    from sentence_transformers.util.quantization import quantize_embeddings

    from python_backend.common.manifest import load_manifest

    floats = api.embeddings.create(model="minilm", input=TEXTS, encoding_format="float")
    vectors = np.array([d.embedding for d in floats.data], dtype=np.float32)
    ranges = np.array(load_manifest(stack.repository / "minilm" / "1").quantization_ranges)
    assert ranges.shape == (2, 384)
    expected = quantize_embeddings(vectors, embedding_type, ranges=ranges)
    answer = api.embeddings.create(
        model="minilm",
        input=TEXTS,
        encoding_format="float",
        extra_body={"embedding_type": embedding_type},
    )
    got = np.array([d.embedding for d in answer.data])
    assert got.shape == expected.shape and np.array_equal(got, expected.astype(np.int64))
    status, packed = raw(
        stack,
        "/v1/embeddings",
        json.dumps(
            {"model": "minilm", "input": TEXTS, "encoding_format": "base64",
             "embedding_type": embedding_type}
        ).encode(),
        {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"},
    )  # fmt: skip
    assert status == 200
    for d, want in zip(packed["data"], expected, strict=True):
        decoded = np.frombuffer(base64.b64decode(d["embedding"]), dtype=expected.dtype)
        assert np.array_equal(decoded, want)


def test_int8_of_shortened_vectors_uses_ranges_of_the_sample_shortened_alike(stack, api):
    """Matryoshka dimensions apply before quantizing: int8 of 128 dimensions is cut from the
    ranges of the builder's sample vectors shortened (and renormalised) the same way."""
    from sentence_transformers.util.quantization import quantize_embeddings

    from python_backend.common.manifest import load_manifest

    version = stack.repository / "minilm_matryoshka" / "1"
    sample = np.load(version / load_manifest(version).quantization_sample)
    head = shorten(sample, 128)
    ranges = np.stack([head.min(axis=0), head.max(axis=0)])
    floats = api.embeddings.create(
        model="minilm_matryoshka", input=TEXTS, dimensions=128, encoding_format="float"
    )
    expected = quantize_embeddings(
        np.array([d.embedding for d in floats.data], dtype=np.float32), "int8", ranges=ranges
    )
    answer = api.embeddings.create(
        model="minilm_matryoshka",
        input=TEXTS,
        dimensions=128,
        encoding_format="float",
        extra_body={"embedding_type": "int8"},
    )
    assert np.array_equal(np.array([d.embedding for d in answer.data]), expected.astype(np.int64))
    binary = api.embeddings.create(
        model="minilm_matryoshka",
        input="x",
        dimensions=128,
        encoding_format="float",
        extra_body={"embedding_type": "binary"},
    )
    assert len(binary.data[0].embedding) == 16  # 128 dimensions, 8 a byte


def raw(stack, path: str, body: bytes | None, headers: dict[str, str]) -> tuple[int, dict]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{stack.http_port}{path}", data=body, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


def test_the_front_doors_own_refusals_on_v1_are_openai_shaped(stack):
    body = json.dumps({"model": "minilm", "input": "x"}).encode()
    status, answer = raw(stack, "/v1/embeddings", body, {"Content-Type": "application/json"})
    assert status == 401 and answer["error"]["code"] == "invalid_api_key"
    big = json.dumps({"model": "minilm", "input": "x" * (2 << 20)}).encode()
    status, answer = raw(stack, "/v1/embeddings", big, {"Authorization": f"Bearer {API_KEY}"})
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    status, answer = raw(stack, "/v1/completions", b"{}", {"Authorization": f"Bearer {API_KEY}"})
    assert status == 404 and answer["error"]["type"] == "invalid_request_error"
    wrong = openai.OpenAI(
        base_url=f"http://127.0.0.1:{stack.http_port}/v1", api_key="wrong-key", max_retries=0
    )
    with pytest.raises(openai.AuthenticationError):
        wrong.embeddings.create(model="minilm", input="x")


QUERY = "how does the planner group rows"
DOCUMENTS = [
    "Bananas are yellow.",
    "It splits the rows sorted by length into groups with an exact dynamic program.",
    "Each group runs at the bucket of its longest row.",
    "Rows longer than the last bucket are grouped by exact length.",
]


def kserve_scores(stack, query: str, documents: list[str]) -> np.ndarray:
    """The reranker's logits through KServe v2 infer on the same door: TEXT with TEXT_PAIR."""
    import tritonclient.http as httpclient

    c = client(stack, "http")
    inputs = []
    for name, texts in (("TEXT", [query] * len(documents)), ("TEXT_PAIR", documents)):
        tensor = httpclient.InferInput(name, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        inputs.append(tensor)
    result = c.infer("reranker", inputs, headers={"authorization": f"Bearer {API_KEY}"})
    return result.as_numpy("SCORE")[:, 0]


def rerank(stack, body: dict) -> tuple[int, dict]:
    return raw(
        stack,
        "/v1/rerank",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
    )


def test_rerank_sorts_documents_by_the_models_own_score(stack):
    logits = kserve_scores(stack, QUERY, DOCUMENTS)
    expected = 1 / (1 + np.exp(-logits.astype(np.float64)))
    status, answer = rerank(stack, {"model": "reranker", "query": QUERY, "documents": DOCUMENTS})
    assert status == 200, answer
    indices = [r["index"] for r in answer["results"]]
    assert indices == list(np.argsort(-expected, kind="stable"))
    got = np.array([r["relevance_score"] for r in answer["results"]])
    assert np.abs(got - expected[indices]).max() <= 1e-6
    assert "document" not in answer["results"][0]
    assert answer["usage"]["prompt_tokens"] > 0


def test_rerank_takes_teis_and_coheres_options(stack):
    logits = kserve_scores(stack, QUERY, DOCUMENTS)
    best = int(np.argmax(logits))
    status, answer = rerank(
        stack,
        {
            "model": "reranker",
            "query": QUERY,
            "texts": DOCUMENTS,  # TEI's name for the documents
            "top_n": 2,
            "return_documents": True,
            "raw_scores": True,
        },
    )
    assert status == 200, answer
    assert len(answer["results"]) == 2
    first = answer["results"][0]
    assert first["index"] == best and first["document"] == {"text": DOCUMENTS[best]}
    assert abs(first["relevance_score"] - float(logits[best])) <= 1e-5
    # Cohere's document objects
    status, answer = rerank(
        stack,
        {"model": "reranker", "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS]},
    )
    assert status == 200 and len(answer["results"]) == len(DOCUMENTS)


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        ({"model": "minilm", "query": "q", "documents": ["d"]}, 400, "is not a reranker"),
        ({"model": "nope", "query": "q", "documents": ["d"]}, 404, "does not exist"),
        ({"model": "reranker", "query": "", "documents": ["d"]}, 400, "`query`"),
        ({"model": "reranker", "query": "q", "documents": []}, 400, "`documents`"),
        ({"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0}, 400, "`top_n`"),
    ],
)
def test_rerank_errors_are_openai_shaped(stack, body, status, words):
    got, answer = rerank(stack, body)
    assert got == status and words in answer["error"]["message"]


def test_rerank_texts_past_the_cap_are_refused_and_rerank_still_serves(stack):
    """Past the text-input cap (8192 tokens x 32 bytes), a query or a document is a 400 naming
    it, before anything is sent to the model; a valid rerank is then still right."""
    too_long = 8192 * 32 + 1
    for body, words in (
        ({"model": "reranker", "query": "q" * too_long, "documents": ["d"]}, "`query`"),
        (
            {"model": "reranker", "query": "q", "documents": ["d", "d" * too_long]},
            f"`documents[1]` is {too_long} bytes",
        ),
    ):
        got, answer = rerank(stack, body)
        assert got == 400 and words in answer["error"]["message"], answer
    logits = kserve_scores(stack, QUERY, DOCUMENTS)
    status, answer = rerank(stack, {"model": "reranker", "query": QUERY, "documents": DOCUMENTS})
    assert status == 200
    assert [r["index"] for r in answer["results"]] == list(np.argsort(-logits, kind="stable"))


def test_a_reranker_does_not_embed(api):
    with pytest.raises(openai.BadRequestError, match="does not serve embeddings"):
        api.embeddings.create(model="reranker", input="x")


def test_a_request_refused_in_one_chunk_leaves_no_work_behind(stack, api):
    """1344 token rows of 100 ids in 21 chunks of 64, one id outside the vocabulary in the first:
    its chunk is refused at once, and the adapter cancels the others, which the model drops
    before their forwards (about 10 s of this CPU's compute if they ran)."""
    from tests.e2e.test_serving import total

    rows = [[1000 + (i % 500)] * 100 for i in range(1344)]
    rows[0][5] = 10**6  # beyond MiniLM's 30522 ids: the server refuses that chunk
    before = total(stack, "planner_rows_total", model="minilm")
    with pytest.raises(openai.BadRequestError) as refused:
        api.embeddings.create(model="minilm", input=rows)
    assert "1000000" in str(refused.value)
    deadline = time.monotonic() + 10  # what was already running finishes
    computed = total(stack, "planner_rows_total", model="minilm") - before
    while time.monotonic() < deadline:
        time.sleep(1.0)
        now = total(stack, "planner_rows_total", model="minilm") - before
        if now == computed:
            break
        computed = now
    assert computed <= 64, f"{computed} rows computed after the refusal: at most one forward's"


def adapter_process(stack):
    import psutil

    assert stack.process is not None
    for child in psutil.Process(stack.process.pid).children(recursive=True):
        if "openai_api" in " ".join(child.cmdline()):
            return child
    raise AssertionError("no OpenAI adapter is running")


def peak_growth(pid: int, send) -> tuple[object, int]:
    """(what ``send()`` returned, the adapter's peak resident memory while it ran, above its
    resident memory before): Linux's high-water mark, reset first (clear_refs 5)."""
    from pathlib import Path

    proc = Path(f"/proc/{pid}")
    (proc / "clear_refs").write_text("5")

    def kilobytes(field: str) -> int:
        line = next(x for x in (proc / "status").read_text().splitlines() if x.startswith(field))
        return int(line.split()[1]) * 1024

    before = kilobytes("VmRSS:")
    result = send()
    return result, kilobytes("VmHWM:") - before


# the adapter's memory is the subject, not the model's forwards: a tiny encoder computes them
TINY = "tiny_embedder"


def tiny_ints() -> tuple[str, dict]:
    """2048 rows of one-digit ids: each 2 bytes of body, a Python int and a slot once read."""
    return "/v1/embeddings", {"model": TINY, "input": [[7] * 8] * 2048}


def a_long_row_beside_short_ones() -> tuple[str, dict]:
    """8192 ids (the most one input may hold) beside 2047 rows of one: a chunk's rows are padded
    to its longest row before they are sent."""
    return "/v1/embeddings", {"model": TINY, "input": [[7] * 8192] + [[7]] * 2047}


def long_rows_spread_over_every_chunk() -> tuple[str, dict]:
    """An 8192-id row at the head of each of 32 chunks of 64, the rest one id each: sent in
    input order, every chunk would be padded to 8192 ids."""
    rows = [[7] * 8192 if i % 64 == 0 else [7] for i in range(2048)]
    return "/v1/embeddings", {"model": TINY, "input": rows}


def one_character_strings() -> tuple[str, dict]:
    return "/v1/embeddings", {"model": TINY, "input": ["a"] * 2048}


def rerank_long_query() -> tuple[str, dict]:
    """A 200 kB query beside 2048 documents: 32 chunks of 64 copies of it (400 MB, were they
    all in flight at once)."""
    query = "what the planner does " * 9000
    return "/v1/rerank", {"model": "reranker", "query": query, "documents": ["d"] * 2048}


@pytest.mark.parametrize(
    "make",
    [
        tiny_ints,
        a_long_row_beside_short_ones,
        long_rows_spread_over_every_chunk,
        one_character_strings,
        rerank_long_query,
    ],
)
def test_the_adapters_memory_is_bounded_by_the_body(stack, make):
    path, payload = make()
    body = json.dumps(payload).encode()
    assert len(body) < 1 << 20  # the stack's MAX_BODY_SIZE
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    adapter = adapter_process(stack)

    def send():
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.http_port}{path}", data=body, headers=headers
        )
        try:
            with urllib.request.urlopen(request, timeout=120) as response:
                return response.status
        except urllib.error.HTTPError as err:
            return err.code, err.read()[:300]

    status, growth = peak_growth(adapter.pid, send)
    assert status == 200
    bound = 16 * len(body) + (64 << 20)
    assert growth <= bound, (
        f"{growth / 2**20:.0f} MB above its resting size; bound {bound / 2**20:.0f} MB"
    )


def eight_mb_of_text() -> tuple[str, dict]:
    """2048 texts of 4 kB in words too long for the vocabulary: many bytes for the adapter to
    hold, few tokens for the model to compute (each word is one unknown token)."""
    return "/v1/embeddings", {"model": TINY, "input": [("w" * 199 + " ") * 20] * 2048}


def eight_mb_rerank() -> tuple[str, dict]:
    """A 250 kB query (near the text cap) beside 512 documents of 15.5 kB: every pair tokenized
    with the whole query, in 8 chunks."""
    query = "what the planner does " * 11_500
    document = "a document the reranker scores " * 500
    return "/v1/rerank", {"model": "reranker", "query": query, "documents": [document] * 512}


@pytest.mark.parametrize("make", [eight_mb_of_text, eight_mb_rerank])
def test_the_adapters_memory_is_bounded_by_an_8mb_body(stack, make):
    """The production door takes 8 MB bodies (the test stack's takes 1 MB): sent to the
    adapter's own loopback port, behind the door, the same bound holds at that size."""
    path, payload = make()
    body = json.dumps(payload).encode()
    assert 7 << 20 < len(body) <= 8 << 20  # MAX_BODY_SIZE's default
    adapter = adapter_process(stack)

    def send():
        request = urllib.request.Request(
            f"http://127.0.0.1:{stack.ports['OPENAI']}{path}",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            answer = json.loads(response.read())
        return response.status, len(answer.get("data") or answer.get("results") or [])

    (status, count), growth = peak_growth(adapter.pid, send)
    assert (status, count) == (200, len(payload.get("input") or payload.get("documents")))
    bound = 16 * len(body) + (64 << 20)
    assert growth <= bound, (
        f"{growth / 2**20:.0f} MB above its resting size; bound {bound / 2**20:.0f} MB"
    )


def test_a_v1_priority_is_kept_by_every_chunk_of_the_request(stack, api):
    """`priority` on /v1 is the request's class: a request of 100 inputs goes to the model in
    chunks, each of them in that class; the vectors are KServe's for the same rows."""
    from tests.e2e.test_serving import total

    texts = [f"bulk document number {k}" for k in range(100)]
    labels = {"model": "minilm", "class": "2"}
    before = total(stack, "planner_class_rows_total", **labels)
    answer = api.embeddings.create(model="minilm", input=texts, extra_body={"priority": 2})
    vectors = np.array([d.embedding for d in answer.data], dtype=np.float32)
    expected = np.concatenate([kserve(stack, texts[a : a + 50])[0] for a in (0, 50)])
    assert np.abs(vectors - expected).max() <= 1e-5
    assert total(stack, "planner_class_rows_total", **labels) - before == 100


def test_a_keys_class_holds_on_v1_too(stack):
    """The bulk key of the stack's keys file (class 2) on /v1: its rows are counted in class 2,
    and asking for class 1 is a 400 naming priority."""
    from tests.e2e.stack import BULK_KEY
    from tests.e2e.test_serving import total

    headers = {"Authorization": f"Bearer {BULK_KEY}", "Content-Type": "application/json"}
    labels = {"model": "minilm", "class": "2"}
    before = total(stack, "planner_class_rows_total", **labels)
    body = {"model": "minilm", "input": ["one", "two"]}
    status, answer = raw(stack, "/v1/embeddings", json.dumps(body).encode(), headers)
    assert status == 200 and len(answer["data"]) == 2
    assert total(stack, "planner_class_rows_total", **labels) - before == 2
    body["priority"] = 1
    status, answer = raw(stack, "/v1/embeddings", json.dumps(body).encode(), headers)
    assert status == 400 and answer["error"]["param"] == "priority", answer
    assert "may ask for class 2 at most" in answer["error"]["message"]
