"""Cohere's v2 API: ``POST /v2/embed`` and ``POST /v2/rerank``, in Cohere's shapes.

``/v2/embed`` reads ``texts``, ``input_type`` (onto the model's own prompts: ``search_query`` its
``query`` prompt, ``search_document`` its ``document`` or ``passage`` prompt, ``classification``
and ``clustering`` prompts of those names; a model without such a prompt embeds the text as it
is), ``embedding_types`` (float, int8, uint8, binary, ubinary with ``/v1``'s ``embedding_type``
meanings; base64: each float vector's little-endian float32 bytes), ``truncate`` (NONE, START,
END), ``output_dimension`` (``/v1``'s ``dimensions``) and ``priority`` (Cohere's 0 first: the
project's class ``priority + 1``). ``/v2/rerank`` reads ``query``, ``documents``, ``top_n`` and
``return_documents``. Each body is read by the ``/v1`` parser under ``/v1``'s names, and errors
answer as Cohere's do: ``{"message"}``, with 400 for a bad request and 429 for a full queue.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection
from contextlib import AbstractContextManager
from typing import Any

import numpy as np

from openai_api import protocol
from openai_api.errors import QUEUE_FULL, OpenAIError, bad_request
from openai_api.protocol import (
    RerankQuery,
    encode_vector,
    rerank_results,
    same_names,
    with_v1_names,
)

# the fields each route reads: Cohere's name -> /v1's (input_type and embedding_types are
# Cohere's own: embed_options reads them; UNSERVED are refused)
RENAMES: dict[str, dict[str, str]] = {
    "embed": {
        "model": "model",
        "texts": "input",
        "truncate": "truncate",
        "output_dimension": "dimensions",
    },
    "rerank": same_names("model", "query", "documents", "top_n", "return_documents", "instruction"),
}
# /v1's embedding types, and base64: the float vectors' bytes
EMBEDDING_TYPES = (*protocol.EMBEDDING_TYPES, "base64")
# Cohere's input_type -> the prompt names that serve it, the first the model has
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("query",),
    "search_document": ("document", "passage"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
API_VERSION = {"version": "2"}
# fields of Cohere's request this server does not serve: refused naming them, never ignored
UNSERVED = {
    "images": "images are not embedded here: send `texts`",
    "inputs": "mixed text and image `inputs` are not embedded here: send `texts`",
    "max_tokens": "inputs are cut at the model's own limit (`truncate`), not at `max_tokens`",
    "max_tokens_per_doc": "documents are cut at the model's own limit, not at `max_tokens_per_doc`",
}


def named_as_sent(route: str) -> AbstractContextManager[None]:
    return protocol.named_as_sent(RENAMES[route])


def as_v1(body: Any, route: str) -> dict[str, Any]:
    """The Cohere ``body`` under ``/v1``'s names, its Cohere-only fields checked and taken out
    (``input_type`` and ``embedding_types``: ``embed_options`` reads them)."""
    out = with_v1_names(body, RENAMES[route])
    for name, why in UNSERVED.items():
        if body.get(name) is not None:
            raise bad_request(f"`{name}`: {why}", param=name)
    priority = body.get("priority")
    if priority is not None:
        if not protocol.is_int(priority) or not 0 <= priority < (1 << 31) - 1:
            raise bad_request(
                "`priority` must be an integer from 0 (served first) up", param="priority"
            )
        out["priority"] = priority + 1
    return out


def embed_options(
    body: dict[str, Any], prompts: Collection[str]
) -> tuple[tuple[str, ...], str | None]:
    """``embedding_types`` (float when absent) and the prompt ``input_type`` picks among the
    model's ``prompts`` (None: the text as it is)."""
    types = body.get("embedding_types")
    if types is None:
        types = ["float"]
    if (
        not isinstance(types, list)
        or not types
        or not all(isinstance(t, str) and t in EMBEDDING_TYPES for t in types)
    ):
        raise bad_request(
            f"`embedding_types` must be a non-empty list of {', '.join(EMBEDDING_TYPES)}",
            param="embedding_types",
        )
    input_type = body.get("input_type")
    prompt = None
    if input_type is not None:
        if not isinstance(input_type, str) or input_type not in INPUT_TYPE_PROMPTS:
            raise bad_request(
                f"`input_type` must be one of {', '.join(INPUT_TYPE_PROMPTS)}",
                param="input_type",
            )
        prompt = next((p for p in INPUT_TYPE_PROMPTS[input_type] if p in prompts), None)
    return tuple(dict.fromkeys(types)), prompt


def embed_response(
    texts: list[str], embeddings: dict[str, np.ndarray], input_tokens: int
) -> dict[str, Any]:
    """Cohere's embeddings by type: each a list in input order (base64: strings)."""
    by_type: dict[str, Any] = {}
    for kind, vectors in embeddings.items():
        by_type[kind] = (
            [encode_vector(v, "base64") for v in vectors] if kind == "base64" else vectors
        )
    return {
        "id": str(uuid.uuid4()),
        "embeddings": by_type,
        "texts": texts,
        "meta": {"api_version": API_VERSION, "billed_units": {"input_tokens": input_tokens}},
        "response_type": "embeddings_by_type",
    }


def rerank_response(query: RerankQuery, logits: np.ndarray) -> dict[str, Any]:
    return {
        "id": str(uuid.uuid4()),
        "results": rerank_results(query, logits),
        "meta": {"api_version": API_VERSION, "billed_units": {"search_units": 1}},
    }


def error(err: OpenAIError) -> tuple[int, dict[str, str]]:
    """Cohere's answer for an error the adapter raised: its status and ``{"message"}``."""
    status = 429 if err.code == QUEUE_FULL else err.status
    return status, {"message": err.message}
