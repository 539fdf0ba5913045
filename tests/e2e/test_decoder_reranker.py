"""A decoder reranker served through the front door: KServe's SCORE is Qwen3-Reranker's recipe run
by transformers on each pair alone (the yes logit less the no logit at the last position), and
every rerank route (/v1/rerank, TEI's /rerank, Cohere's /v2/rerank, NIM's /v1/ranking) answers
its probability of yes, with an instruction of the request's own where it names one."""

from __future__ import annotations

import numpy as np
import pytest

from testkit.triton_clients import client
from tests.e2e.stack import API_KEY
from tests.e2e.test_other_apis import ok

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MODEL = "qwen3_reranker"
QUERY = "how does the planner group rows"
DOCUMENTS = ["by length into buckets", "yes no no", "the Query and the Document"]


def kserve_scores(stack, query: str, documents: list[str], **parameters) -> np.ndarray:
    import tritonclient.http as httpclient

    inputs = []
    for name, texts in (("TEXT", [query] * len(documents)), ("TEXT_PAIR", documents)):
        tensor = httpclient.InferInput(name, [len(texts), 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=object))
        inputs.append(tensor)
    result = client(stack, "http").infer(
        MODEL,
        inputs,
        parameters=parameters or None,
        headers={"authorization": f"Bearer {API_KEY}"},
    )
    return result.as_numpy("SCORE")[:, 0].astype(np.float64)


def recipe(stack, query: str, documents: list[str], instruction: str | None = None) -> np.ndarray:
    """The yes logit less the no logit, by Qwen3-Reranker's usage code on the model's files."""
    from python_backend.common.manifest import load_manifest

    version = stack.repository / MODEL / "1"
    template = load_manifest(version).rerank_template
    folder = load_manifest(version).source["model_dir"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    instruction = template.instruction if instruction is None else instruction
    out = []
    for document in documents:
        body = f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"
        ids = [*template.prefix_ids, *tokenizer(body)["input_ids"], *template.suffix_ids]
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, -1]
        out.append(float(logits[template.yes_id] - logits[template.no_id]))
    return np.array(out)


def test_kserve_serves_the_recipes_score(stack):
    assert (
        np.abs(kserve_scores(stack, QUERY, DOCUMENTS) - recipe(stack, QUERY, DOCUMENTS)).max()
        <= 1e-4
    )


def test_every_rerank_route_answers_the_probability_of_yes(stack):
    logits = kserve_scores(stack, QUERY, DOCUMENTS)
    p_yes = 1 / (1 + np.exp(-logits))
    order = list(np.argsort(-p_yes, kind="stable"))
    v1 = ok(stack, "/v1/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    tei = ok(stack, f"/models/{MODEL}/rerank", {"query": QUERY, "texts": DOCUMENTS})
    cohere = ok(stack, "/v2/rerank", {"model": MODEL, "query": QUERY, "documents": DOCUMENTS})
    nim = ok(
        stack,
        "/v1/ranking",
        {"model": MODEL, "query": {"text": QUERY}, "passages": [{"text": d} for d in DOCUMENTS]},
    )
    answers = {
        "v1": [(r["index"], r["relevance_score"]) for r in v1["results"]],
        "tei": [(r["index"], r["score"]) for r in tei],
        "cohere": [(r["index"], r["relevance_score"]) for r in cohere["results"]],
        "nim": [(r["index"], 1 / (1 + np.exp(-r["logit"]))) for r in nim["rankings"]],
    }
    for route, ranked in answers.items():
        assert [i for i, _ in ranked] == order, route
        assert np.abs(np.array([s for _, s in ranked]) - p_yes[order]).max() <= 1e-6, route


def test_a_request_names_its_own_instruction(stack):
    mine = "Find the document that answers yes or no"
    logits = kserve_scores(stack, QUERY, DOCUMENTS, instruction=mine)
    assert np.abs(logits - recipe(stack, QUERY, DOCUMENTS, mine)).max() <= 1e-4
    assert np.abs(logits - kserve_scores(stack, QUERY, DOCUMENTS)).max() > 1e-6
    v1 = ok(
        stack,
        "/v1/rerank",
        {"model": MODEL, "query": QUERY, "documents": DOCUMENTS, "instruction": mine,
         "raw_scores": True},
    )  # fmt: skip
    got = {r["index"]: r["relevance_score"] for r in v1["results"]}
    assert np.abs(np.array([got[i] for i in range(len(DOCUMENTS))]) - logits).max() <= 1e-5
    # every rerank route takes it
    p_yes = 1 / (1 + np.exp(-logits))
    body = {"query": QUERY, "instruction": mine}
    routes = {
        "/v2/rerank": ({**body, "model": MODEL, "documents": DOCUMENTS}, "results", "relevance_score"),
        f"/models/{MODEL}/rerank": ({**body, "texts": DOCUMENTS}, None, "score"),
        "/v1/ranking": (
            {"model": MODEL, "query": {"text": QUERY}, "instruction": mine,
             "passages": [{"text": d} for d in DOCUMENTS]},
            "rankings",
            "logit",
        ),
    }  # fmt: skip
    for path, (sent, key, score) in routes.items():
        answer = ok(stack, path, sent)
        ranks = {r["index"]: r[score] for r in (answer[key] if key else answer)}
        want = logits if score == "logit" else p_yes
        got_scores = np.array([ranks[i] for i in range(len(DOCUMENTS))])
        assert np.abs(got_scores - want).max() <= 1e-5, path


def test_an_instruction_to_a_cross_encoder_is_refused_naming_it(stack):
    from tests.e2e.test_other_apis import call

    status, answer = call(
        stack,
        "/v1/rerank",
        {"model": "reranker", "query": "q", "documents": ["d"], "instruction": "x"},
    )
    assert status == 400 and answer["error"]["param"] == "instruction", answer
