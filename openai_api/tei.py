"""text-embeddings-inference's routes, in TEI's shapes: ``POST /embed``, ``/rerank``, ``/predict``,
``/similarity``, ``/tokenize``, ``/decode``, ``GET /info``, and ``POST /`` (and SageMaker's
``/invocations``) answering as TEI does for the model's kind; each also under ``/models/{model}``
(the bare routes serve the adapter's default model). ``/embed_all`` and ``/embed_sparse`` are
answered 424: the models here serve pooled vectors.

Each TEI body is read by the ``/v1`` route's own parser after its TEI field names are put in
``/v1``'s (``inputs`` is ``input``, ``truncation_direction`` is ``truncation_side``,
``return_text`` is ``return_documents``), and an error names the field as the client sent it:
one reading of every field, two spellings. Errors answer as TEI does: ``{"error", "error_type"}``
with 422 for a field the request got wrong, 424 for a model that does not do what the route asks,
429 for a full queue, 503 while the model is unavailable.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from openai_api import protocol
from openai_api.errors import EMPTY, QUEUE_FULL, WRONG_MODEL, OpenAIError, bad_request
from openai_api.protocol import (
    InputLimits,
    RerankQuery,
    check_text_size,
    ranked,
    same_names,
    with_v1_names,
)

# the fields each TEI route reads (and this project's `priority`): TEI's name -> /v1's
TRUNCATION = {"truncate": "truncate", "truncation_direction": "truncation_side"}
RENAMES: dict[str, dict[str, str]] = {
    "embed": {
        "inputs": "input",
        **TRUNCATION,
        **same_names("normalize", "prompt_name", "dimensions", "priority"),
    },
    "rerank": {
        **same_names("query", "texts", "raw_scores", "priority", "instruction"),
        **TRUNCATION,
        "return_text": "return_documents",
    },
    "predict": {
        "inputs": "input",
        **TRUNCATION,
        **same_names("raw_scores", "priority", "instruction"),
    },
    "similarity": {**TRUNCATION, **same_names("prompt_name", "priority")},  # its `parameters`
    "tokenize": same_names("inputs", "add_special_tokens", "prompt_name"),
    "decode": same_names("ids", "skip_special_tokens"),
}
# TEI's request shapes spell directions either way (serde aliases)
DIRECTIONS = {"Left": "left", "Right": "right", "left": "left", "right": "right"}


def is_tei(path: str) -> bool:
    """Whether the adapter answers ``path`` in TEI's shapes (all but /v1's, /v2's and /health)."""
    return not path.startswith(("/v1/", "/v2/")) and path != "/health"


def as_v1(body: Any, model: str, route: str, defaults: dict[str, Any] | None = None) -> dict:
    """The TEI ``body`` with ``/v1``'s field names and the route's ``model`` (TEI's bodies name
    none); ``defaults``: TEI's defaults where they differ from ``/v1``'s."""
    out = with_v1_names(body, RENAMES[route])
    if route == "rerank":
        out.setdefault("texts", None)  # the documents' field is TEI's, sent or not
    side = out.get("truncation_side")
    if isinstance(side, str) and side in DIRECTIONS:
        out["truncation_side"] = DIRECTIONS[side]
    for name, value in (defaults or {}).items():
        if out.get(name) is None:
            out[name] = value
    out["model"] = model
    return out


def named_as_sent(route: str) -> AbstractContextManager[None]:
    """Errors raised inside name the TEI field the client sent, not its ``/v1`` spelling."""
    return protocol.named_as_sent(RENAMES[route])


# OpenAI-shaped refusals -> TEI's status and error_type
def error(err: OpenAIError) -> tuple[int, dict[str, str]]:
    """TEI's answer for an error the adapter raised: its status and ``{error, error_type}``."""
    if err.code == WRONG_MODEL or err.status == 500:
        status, kind = 424, "Backend"  # TEI: the model cannot do it, or inference failed
    elif err.code == EMPTY:
        status, kind = 400, "Empty"
    elif err.status == 400:
        status, kind = 422, "Validation"
    elif err.code == QUEUE_FULL:
        status, kind = 429, "Overloaded"
    elif err.status == 503:
        status, kind = 503, "Unhealthy"
    elif err.status >= 500:
        status, kind = err.status, "Backend"
    else:
        status, kind = err.status, "Validation"
    return status, {"error": err.message, "error_type": kind}


def similarity_body(body: Any, model: str, limits: InputLimits, max_inputs: int) -> dict:
    """``/similarity``'s ``inputs`` (``source_sentence``, ``sentences``) and ``parameters`` as
    a ``/v1`` embeddings body: the source first, unit vectors (their dot products are cosines)."""
    inputs = body.get("inputs") if isinstance(body, dict) else None
    source = inputs.get("source_sentence") if isinstance(inputs, dict) else None
    sentences = inputs.get("sentences") if isinstance(inputs, dict) else None
    if not isinstance(source, str) or not source.strip():
        raise bad_request("`inputs.source_sentence` must be a non-empty string", param="inputs")
    if not isinstance(sentences, list) or not sentences:
        raise bad_request("`inputs.sentences` must be a non-empty list of strings", "inputs")
    if len(sentences) + 1 > max_inputs:
        raise bad_request(
            f"`inputs.sentences` has {len(sentences)} items; at most {max_inputs - 1}", "inputs"
        )
    for i, text in enumerate([source, *sentences]):
        where = "inputs.source_sentence" if i == 0 else f"inputs.sentences[{i - 1}]"
        if not isinstance(text, str) or not text.strip():
            raise bad_request(f"`{where}` must be a non-empty string", param="inputs")
        check_text_size(text, where, "inputs", limits)
    parameters = body.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise bad_request("`parameters` must be an object", param="parameters")
    out = as_v1(parameters or {}, model, "similarity", {"normalize": True})
    out["input"] = [source, *sentences]
    return out


def rerank_response(query: RerankQuery, logits: np.ndarray) -> list[dict[str, Any]]:
    """TEI's ranks: best first, each with its index (and its text with ``return_text``)."""
    out = []
    for i, score in ranked(query, logits):
        rank: dict[str, Any] = {"index": i, "score": score}
        if query.return_documents:
            rank["text"] = query.documents[i]
        out.append(rank)
    return out


@dataclass(frozen=True)
class PredictInputs:
    """``/predict``'s inputs: each a text or a (text, text) pair; ``single``: the request sent
    one (answered as one list of predictions, not a list of them); ``raw_scores``: the logits,
    not their sigmoid or softmax."""

    rows: list[tuple[str, ...]]
    single: bool
    raw_scores: bool = False

    @property
    def pairs(self) -> bool:
        return len(self.rows[0]) == 2


PREDICT_SHAPE = (
    "`inputs` must be a string, a pair of strings [string, string], or a batch of them "
    "[[string], [string, string], ...]"
)


def parse_predict(body: Any, max_inputs: int, limits: InputLimits) -> PredictInputs:
    """TEI's ``inputs`` of ``/predict``: one sequence, or a batch; every sequence of a request
    is a text, or every one a pair (a model takes one or the other)."""
    raw = body.get("inputs") if isinstance(body, dict) else None
    rows: list[tuple[str, ...]]
    if isinstance(raw, str):
        rows, single = [(raw,)], True
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        if len(raw) > 2:
            raise bad_request(PREDICT_SHAPE, param="inputs")
        rows, single = [tuple(raw)], True
    elif isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        if len(raw) > max_inputs:
            raise bad_request(f"`inputs` has {len(raw)} items; at most {max_inputs}", "inputs")
        for i, x in enumerate(raw):
            if not 1 <= len(x) <= 2 or not all(isinstance(t, str) for t in x):
                raise bad_request(f"`inputs[{i}]`: {PREDICT_SHAPE[9:]}", param="inputs")
        rows, single = [tuple(x) for x in raw], False
    else:
        raise bad_request(PREDICT_SHAPE, param="inputs", code=EMPTY if raw == [] else None)
    for i, row in enumerate(rows):
        for j, text in enumerate(row):
            where = (
                f"inputs[{i}][{j}]" if not single else "inputs" if len(row) == 1 else f"inputs[{j}]"
            )
            if not text.strip():
                raise bad_request(f"`{where}` is an empty string", param="inputs")
            check_text_size(text, where, "inputs", limits)
    if len({len(r) for r in rows}) > 1:
        raise bad_request(
            "`inputs` mixes texts and pairs: send one kind in a request", param="inputs"
        )
    raw_scores = body.get("raw_scores", False)
    if not isinstance(raw_scores, bool):
        raise bad_request("`raw_scores` must be true or false", param="raw_scores")
    return PredictInputs(rows, single, raw_scores)


def predictions(
    logits: np.ndarray, labels: tuple[str, ...], raw_scores: bool, single: bool
) -> list[Any]:
    """TEI's predictions: per input, every class's score, best first, named by the model's
    labels (``LABEL_i`` where it names none); the scores are the logits with ``raw_scores``, else
    a sigmoid for a one-class model and a softmax for several, as TEI applies them."""
    z = logits.astype(np.float64)
    if raw_scores:
        scores = z
    elif z.shape[1] == 1:
        scores = 1.0 / (1.0 + np.exp(-z))
    else:
        e = np.exp(z - z.max(axis=1, keepdims=True))
        scores = e / e.sum(axis=1, keepdims=True)
    out = []
    for row in scores:
        order = np.argsort(-row, kind="stable")
        out.append(
            [
                {"score": float(row[c]), "label": labels[c] if c < len(labels) else f"LABEL_{c}"}
                for c in order
            ]
        )
    return out[0] if single else out
