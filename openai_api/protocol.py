"""OpenAI's embeddings request and response, as plain data: every check names the field.

``input`` is a string, a list of strings, a list of token ids (one input), or a list of
token-id lists (taken as already prompted); ``prompt_name`` (or NIM's ``input_type``: query,
passage, document) picks one of the model's sentence-transformers prompts for text input; ``encoding_format`` is ``float`` or ``base64`` (little-endian float32, as
OpenAI's clients decode it); ``dimensions`` shortens each vector, then renormalises it, and only
for models that declare the sizes they allow. Rows over the model's limit are cut from the
end the request names: ``truncation_side`` (``right``, the default, or ``left``), or NIM's
``truncate`` (``END``: right, ``START``: left, ``NONE``: refused with a 400 naming the input, its
length and the limit); without either, the model's own default stands.
"""

from __future__ import annotations

import base64
import re
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from openai_api.errors import EMPTY, OpenAIError, bad_request
from python_backend.common.contract import MAX_TEXT_BYTES_PER_TOKEN, TRUNCATION_SIDES

MAX_INPUTS = 2048  # OpenAI's own limit on inputs per request
MAX_TOKEN_ID = 2**31 - 1  # token ids are vocabulary indices: far below this, never above int64


@dataclass(frozen=True)
class InputLimits:
    """What one request may ask for, checked before anything is padded, copied or sent: the
    adapter's memory is then bounded by its body size (``--max-tokens-per-input``,
    ``--max-tokens-per-request``; OpenAI's own limits by default)."""

    max_tokens_per_input: int = 8192
    max_tokens_per_request: int = 300_000

    @property
    def max_text_bytes_per_input(self) -> int:
        """A text input's UTF-8 bytes, derived from the token cap as KServe's text rows are."""
        return self.max_tokens_per_input * MAX_TEXT_BYTES_PER_TOKEN


ENCODINGS = ("float", "base64")
# NIM's `embedding_type`, with sentence-transformers' `quantize_embeddings` meanings: int8 and
# uint8 are scalar quantization over the model's calibrated per-dimension ranges, binary and
# ubinary the signs packed into bits (8 dimensions a byte), as int8 offset by -128 and as uint8
EMBEDDING_TYPES = ("float", "int8", "uint8", "binary", "ubinary")
QUANTIZED_DTYPES = {"int8": np.int8, "uint8": np.uint8, "binary": np.int8, "ubinary": np.uint8}
# NIM's (and Cohere's) `truncate`: which end of an over-long input is cut, or none (refused)
NIM_TRUNCATE = {"END": "right", "START": "left", "NONE": None}


@dataclass(frozen=True)
class Truncation:
    """What a request says of inputs over the model's limit; None: the model's default."""

    truncate: bool | None = None  # False: refuse them (NIM's NONE)
    side: str | None = None  # a TRUNCATION_SIDES value

    def parameters(self) -> dict[str, Any]:
        """The KServe request parameters that say it to the model."""
        out: dict[str, Any] = {}
        if self.truncate is not None:
            out["truncate"] = self.truncate
        if self.side is not None:
            out["truncation_side"] = self.side
        return out


MODEL_DEFAULT = Truncation()  # a request that says neither


def shown(value: Any) -> str:
    """A refused value as an error quotes it: a scalar, cut to 64 characters; a list or an object
    by its kind only (printing a deeply nested one would recurse past Python's limit)."""
    if isinstance(value, (list, dict)):
        return "a list" if isinstance(value, list) else "an object"
    return repr(value)[:64]


# -- other APIs' bodies (TEI's, Cohere's, NIM's), read by the /v1 parsers ------------------------


def same_names(*names: str) -> dict[str, str]:
    """Fields another API names as /v1 does (for ``with_v1_names``)."""
    return {name: name for name in names}


def with_v1_names(body: Any, fields: dict[str, str]) -> dict[str, Any]:
    """The fields of ``body`` its API defines (``fields``: each one's /v1 name), under their /v1
    names; any other field is left out, as that API's own server ignores it."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    return {v1_name: body[name] for name, v1_name in fields.items() if name in body}


@contextmanager
def named_as_sent(renames: dict[str, str]) -> Iterator[None]:
    """Errors raised inside name the field the client sent (a key of ``renames``), not its /v1
    spelling."""
    try:
        yield
    except OpenAIError as err:
        sent = {v1_name: name for name, v1_name in renames.items()}.get(err.param or "")
        if sent is not None:  # the field named first, as /v1's messages name it
            field = rf"`{re.escape(err.param or '')}(?=[`\[ ])"
            err.message = re.sub(field, f"`{sent}", err.message, count=1)
            err.param = sent
        raise


def parse_priority(body: dict[str, Any]) -> int:
    """``priority``: the request's service class (1 first; 0 or absent: the default), as KServe
    requests name it; every chunk of the request keeps it."""
    priority = body.get("priority")
    if priority is None:
        return 0
    if not is_int(priority) or not 0 <= priority < 1 << 31:
        raise bad_request(
            "`priority` must be a class number (1 is served first; 0 or absent: the default)",
            param="priority",
        )
    return int(priority)


def parse_truncation(body: dict[str, Any]) -> Truncation:
    """``truncation_side`` or NIM's ``truncate``, checked (one of them at most)."""
    side = body.get("truncation_side")
    if side is not None and (not isinstance(side, str) or side not in TRUNCATION_SIDES):
        raise bad_request(
            f"`truncation_side` must be one of {', '.join(TRUNCATION_SIDES)}, got {shown(side)}",
            param="truncation_side",
        )
    nim = body.get("truncate")
    if nim is None:
        return Truncation(side=side)
    if isinstance(nim, bool):  # TEI's form: cut (from truncation_side's end), or refuse
        return Truncation(truncate=nim, side=side)
    if not isinstance(nim, str) or nim not in NIM_TRUNCATE:
        raise bad_request(
            f"`truncate` must be one of {', '.join(NIM_TRUNCATE)} (or true, false), got "
            f"{shown(nim)}",
            param="truncate",
        )
    if side is not None:
        raise bad_request("send `truncate` or `truncation_side`, not both", param="truncate")
    if NIM_TRUNCATE[nim] is None:
        return Truncation(truncate=False)
    return Truncation(truncate=True, side=NIM_TRUNCATE[nim])


# NIM's `input_type`, onto the prompt names sentence-transformers models use for it
INPUT_TYPES = {"query": "query", "passage": "passage", "document": "document"}


@dataclass(frozen=True)
class EmbeddingsQuery:
    model: str
    texts: list[str] | None  # text inputs, or
    token_rows: list[list[int]] | None  # token-id inputs (already prompted, if at all)
    encoding_format: str
    dimensions: int | None
    prompt_name: str | None = None  # one of the model's prompts, prepended to each text
    truncation: Truncation = MODEL_DEFAULT
    normalize: bool | None = None  # unit vectors or the pooled ones; None: the model's default
    embedding_type: str = "float"  # a value of EMBEDDING_TYPES
    priority: int = 0  # its service class (parse_priority)

    @property
    def count(self) -> int:
        return len(self.texts if self.texts is not None else self.token_rows or [])


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _model(body: Any) -> str:
    """The served model a request body names (the body must be a JSON object)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` is required: the name of a served model", param="model")
    return model


def _check_token_rows(rows: list[list[int]], limits: InputLimits) -> None:
    total = 0
    for i, row in enumerate(rows):
        if len(row) > limits.max_tokens_per_input:
            raise bad_request(
                f"`input[{i}]` has {len(row)} tokens; at most {limits.max_tokens_per_input} an "
                "input",
                param="input",
            )
        bad = next((t for t in row if not 0 <= t <= MAX_TOKEN_ID), None)
        if bad is not None:
            raise bad_request(
                f"`input[{i}]` holds the token id {bad}: ids are integers from 0 to {MAX_TOKEN_ID}",
                param="input",
            )
        total += len(row)
    if total > limits.max_tokens_per_request:
        raise bad_request(
            f"`input` has {total} tokens; at most {limits.max_tokens_per_request} a request",
            param="input",
        )


def check_text_size(text: str, where: str, param: str, limits: InputLimits) -> None:
    # a character is at most 4 UTF-8 bytes: only a long text needs encoding to count
    if len(text) * 4 > limits.max_text_bytes_per_input:
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > limits.max_text_bytes_per_input:
            raise bad_request(
                f"`{where}` is {size} bytes; at most {limits.max_text_bytes_per_input} a text input",
                param=param,
            )


def parse_inputs(
    body: dict[str, Any], limits: InputLimits
) -> tuple[list[str] | None, list[list[int]] | None]:
    """``input``: (texts, None) or (None, token-id rows), each checked against the caps."""
    raw = body.get("input")
    texts: list[str] | None = None
    token_rows: list[list[int]] | None = None
    if isinstance(raw, str):
        texts = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(x, str) for x in raw):
        texts = list(raw)
    elif isinstance(raw, list) and raw and all(is_int(x) for x in raw):
        token_rows = [list(raw)]
    elif isinstance(raw, list) and raw and all(isinstance(x, list) for x in raw):
        for i, row in enumerate(raw):
            if not row or not all(is_int(t) for t in row):
                raise bad_request(
                    f"`input[{i}]` must be a non-empty list of token ids (integers)", param="input"
                )
        token_rows = [list(row) for row in raw]
    else:
        raise bad_request(
            "`input` must be a string, a non-empty list of strings, a list of token ids, or a "
            "list of token-id lists",
            param="input",
            code=EMPTY if raw == [] else None,
        )
    count = len(texts) if texts is not None else len(token_rows or [])
    if count > MAX_INPUTS:
        raise bad_request(f"`input` has {count} items; at most {MAX_INPUTS}", param="input")
    if texts is not None:
        for i, text in enumerate(texts):
            if not text:
                raise bad_request(f"`input[{i}]` is an empty string", param="input")
            check_text_size(text, f"input[{i}]", "input", limits)
    if token_rows is not None:
        _check_token_rows(token_rows, limits)
    return texts, token_rows


def parse_embeddings(body: Any, limits: InputLimits | None = None) -> EmbeddingsQuery:
    limits = limits or InputLimits()
    model = _model(body)
    texts, token_rows = parse_inputs(body, limits)
    encoding = body.get("encoding_format", "float")
    if encoding is None:
        encoding = "float"
    if encoding not in ENCODINGS:
        raise bad_request(
            f"`encoding_format` must be one of {', '.join(ENCODINGS)}, got {shown(encoding)}",
            param="encoding_format",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (not is_int(dimensions) or dimensions < 1):
        raise bad_request("`dimensions` must be a positive integer", param="dimensions")
    normalize = body.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise bad_request("`normalize` must be true or false", param="normalize")
    embedding_type = body.get("embedding_type", "float")
    if embedding_type is None:
        embedding_type = "float"
    if not isinstance(embedding_type, str) or embedding_type not in EMBEDDING_TYPES:
        raise bad_request(
            f"`embedding_type` must be one of {', '.join(EMBEDDING_TYPES)}, got "
            f"{shown(embedding_type)}",
            param="embedding_type",
        )
    if embedding_type.endswith("int8") and normalize is not None:
        raise bad_request(
            f"`embedding_type` {embedding_type} is cut from ranges calibrated on the model's own "
            "vectors: send it without `normalize`",
            param="embedding_type",
        )
    return EmbeddingsQuery(
        model,
        texts,
        token_rows,
        encoding,
        dimensions,
        parse_prompt_name(body),
        parse_truncation(body),
        normalize,
        embedding_type,
        parse_priority(body),
    )


def parse_prompt_name(body: dict[str, Any]) -> str | None:
    """``prompt_name``, or NIM's ``input_type`` (one of them at most)."""
    prompt_name = body.get("prompt_name")
    if prompt_name is not None and (not isinstance(prompt_name, str) or not prompt_name):
        raise bad_request("`prompt_name` must be the name of a prompt", param="prompt_name")
    input_type = body.get("input_type")
    if input_type is not None:
        if not isinstance(input_type, str) or input_type not in INPUT_TYPES:
            raise bad_request(
                f"`input_type` must be one of {', '.join(INPUT_TYPES)}, got {shown(input_type)}",
                param="input_type",
            )
        if prompt_name is not None:
            raise bad_request("send `prompt_name` or `input_type`, not both", param="input_type")
        prompt_name = INPUT_TYPES[input_type]
    return prompt_name


def shorten(vectors: np.ndarray, dimensions: int, normalized: bool = True) -> np.ndarray:
    """The first ``dimensions`` of each vector (Matryoshka), scaled back to unit length where
    the vectors were unit vectors."""
    head = vectors[:, :dimensions].astype(np.float32, copy=True)
    if not normalized:
        return head
    norms = np.linalg.norm(head, axis=1, keepdims=True)
    return head / np.maximum(norms, 1e-12)


def quantize(
    vectors: np.ndarray,
    embedding_type: str,
    ranges: tuple[Any, Any] | None = None,
) -> np.ndarray:
    """The vectors as ``embedding_type`` (float32 unchanged); int8 and uint8 need the model's
    ``ranges`` (per-dimension min and max, shape [2, D])."""
    if embedding_type == "float":
        return vectors.astype(np.float32, copy=False)
    if embedding_type.endswith("binary"):
        bits = np.packbits(vectors > 0, axis=-1)
        return (bits.astype(np.int16) - 128).astype(np.int8) if embedding_type == "binary" else bits
    assert ranges is not None
    starts = np.asarray(ranges[0], dtype=np.float32)
    steps = (np.asarray(ranges[1], dtype=np.float32) - starts) / 255
    steps = np.where(steps == 0, 1, steps)
    levels = np.clip(np.floor((vectors - starts) / steps), 0, 255)
    return (levels - 128).astype(np.int8) if embedding_type == "int8" else levels.astype(np.uint8)


def encode_vector(vector: np.ndarray, encoding: str) -> np.ndarray | str:
    """base64 of the vector's raw bytes (float32 little-endian, as OpenAI's clients decode it,
    or the int8 / uint8 bytes of a quantized one), or the vector itself (the response
    serializer writes numpy arrays as JSON lists directly)."""
    if vector.dtype in (np.int8, np.uint8):
        if encoding == "base64":
            return base64.b64encode(vector.tobytes()).decode("ascii")
        return np.ascontiguousarray(vector)
    if encoding == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return np.ascontiguousarray(vector, dtype=np.float32)


def embeddings_response(
    model: str, vectors: np.ndarray, encoding: str, prompt_tokens: int
) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": encode_vector(v, encoding)}
            for i, v in enumerate(vectors)
        ],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def model_card(name: str, created: int) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": created, "owned_by": "triton-batch-planner"}


@dataclass(frozen=True)
class RerankQuery:
    """The request shape TEI and Cohere share: a query, documents (or TEI's texts), top_n,
    return_documents; ``raw_scores`` (TEI) returns the model's logits instead of sigmoids."""

    model: str
    query: str | list[str]  # one for every document, or each document's own (TEI's /predict)
    documents: list[str]
    top_n: int | None
    return_documents: bool
    raw_scores: bool
    truncation: Truncation = MODEL_DEFAULT
    priority: int = 0  # its service class (parse_priority)
    field: str = "documents"  # the field the documents came in, to name one in an error
    instruction: str | None = None  # a decoder reranker's instruction; None: the model's own


def parse_instruction(body: dict[str, Any], limits: InputLimits | None = None) -> str | None:
    """``instruction``: what a decoder reranker is told to judge (its template's default when
    absent), at most a text input's size; a model without a template refuses it."""
    instruction = body.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise bad_request("`instruction` must be a string", param="instruction")
    if instruction is not None:
        check_text_size(instruction, "instruction", "instruction", limits or InputLimits())
    return instruction


def parse_rerank(body: Any, limits: InputLimits | None = None) -> RerankQuery:
    limits = limits or InputLimits()
    model = _model(body)
    query = body.get("query")
    if not isinstance(query, str) or not query.strip():
        raise bad_request("`query` must be a non-empty string", param="query")
    check_text_size(query, "query", "query", limits)
    if "documents" in body and "texts" in body:
        raise bad_request("send `documents` or `texts`, not both", param="documents")
    param = "texts" if "texts" in body else "documents"
    raw = body.get(param)
    if not isinstance(raw, list) or not raw:
        empty = EMPTY if raw == [] else None
        raise bad_request(f"`{param}` must be a non-empty list", param=param, code=empty)
    documents = []
    for i, doc in enumerate(raw):
        text = doc.get("text") if isinstance(doc, dict) else doc  # Cohere: {"text": ...}
        if not isinstance(text, str) or not text.strip():
            raise bad_request(f"`{param}[{i}]` must be a non-empty string", param=param)
        check_text_size(text, f"{param}[{i}]", param, limits)
        documents.append(text)
    if len(documents) > MAX_INPUTS:
        raise bad_request(
            f"`{param}` has {len(documents)} items; at most {MAX_INPUTS}", param=param
        )
    top_n = body.get("top_n")
    if top_n is not None and (not is_int(top_n) or top_n < 1):
        raise bad_request("`top_n` must be a positive integer", param="top_n")
    flags = {}
    for name in ("return_documents", "raw_scores"):
        value = body.get(name, False)
        if not isinstance(value, bool):
            raise bad_request(f"`{name}` must be true or false", param=name)
        flags[name] = value
    return RerankQuery(
        model,
        query,
        documents,
        top_n,
        flags["return_documents"],
        flags["raw_scores"],
        parse_truncation(body),
        parse_priority(body),
        param,
        parse_instruction(body, limits),
    )


def ranked(query: RerankQuery, logits: np.ndarray) -> list[tuple[int, float]]:
    """(document index, score), best first, ``top_n`` of them: the score is the logit with
    ``raw_scores``, else its sigmoid."""
    scores = logits if query.raw_scores else 1.0 / (1.0 + np.exp(-logits.astype(np.float64)))
    order = np.argsort(-scores, kind="stable")[: query.top_n]
    return [(int(i), float(scores[i])) for i in order]


def rerank_results(query: RerankQuery, logits: np.ndarray) -> list[dict[str, Any]]:
    """Results sorted by score, best first, each with its index in the request (and its
    document with ``return_documents``): Cohere's shape, which /v1 shares."""
    results = []
    for i, score in ranked(query, logits):
        result: dict[str, Any] = {"index": i, "relevance_score": score}
        if query.return_documents:
            result["document"] = {"text": query.documents[i]}
        results.append(result)
    return results


def rerank_response(query: RerankQuery, logits: np.ndarray, prompt_tokens: int) -> dict[str, Any]:
    return {
        "object": "list",
        "model": query.model,
        "results": rerank_results(query, logits),
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


# -- /v1/ranking (NIM's shape) --------------------------------------------------------------------

RANKING_NAMES = {
    **same_names("model", "query", "truncate", "priority", "instruction"),
    "passages": "documents",
}


def parse_ranking(body: Any, limits: InputLimits | None = None) -> RerankQuery:
    """NIM's ranking request: ``query`` and ``passages`` as ``{"text": ...}`` objects,
    ``truncate`` NONE or END; every passage is answered, by its logit."""
    v1 = with_v1_names(body, RANKING_NAMES)
    query = v1.get("query")
    if not isinstance(query, dict) or not isinstance(query.get("text"), str):
        raise bad_request('`query` must be an object {"text": "..."}', param="query")
    v1["query"] = query["text"]
    v1["raw_scores"] = True
    return parse_rerank(v1, limits)


def ranking_response(query: RerankQuery, logits: np.ndarray, prompt_tokens: int) -> dict[str, Any]:
    return {
        "rankings": [{"index": i, "logit": score} for i, score in ranked(query, logits)],
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


# -- /v1/classify (vLLM's shape) -----------------------------------------------------------------


@dataclass(frozen=True)
class ClassifyQuery:
    model: str
    texts: list[str] | None
    token_rows: list[list[int]] | None
    truncation: Truncation = MODEL_DEFAULT
    priority: int = 0  # its service class (parse_priority)


def parse_classify(body: Any, limits: InputLimits | None = None) -> ClassifyQuery:
    limits = limits or InputLimits()
    model = _model(body)
    texts, token_rows = parse_inputs(body, limits)
    return ClassifyQuery(model, texts, token_rows, parse_truncation(body), parse_priority(body))


def classify_response(
    model: str, logits: np.ndarray, labels: tuple[str, ...], prompt_tokens: int, created: int
) -> dict[str, Any]:
    """Each input's class probabilities (the softmax of its logits) and its most likely class,
    named as the model names its classes (``LABEL_i`` where it names none)."""
    z = logits.astype(np.float64)
    z = np.exp(z - z.max(axis=1, keepdims=True))
    probs = z / z.sum(axis=1, keepdims=True)
    data = []
    for i, row in enumerate(probs):
        best = int(np.argmax(row))
        data.append(
            {
                "index": i,
                "label": labels[best] if best < len(labels) else f"LABEL_{best}",
                "probs": [float(p) for p in row],
                "num_classes": len(row),
            }
        )
    return {
        "id": f"classify-{uuid.uuid4().hex}",
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "total_tokens": prompt_tokens,
            "completion_tokens": 0,
            "prompt_tokens_details": None,
        },
    }


# -- /v1/tokenize, /v1/decode (TEI's shapes, with this project's `model`) ------------------------


@dataclass(frozen=True)
class TokenizeQuery:
    model: str
    texts: list[str]
    add_special_tokens: bool
    prompt_name: str | None
    truncation: Truncation


def _flag(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"`{name}` must be true or false", param=name)
    return value


def parse_tokenize(body: Any, limits: InputLimits | None = None) -> TokenizeQuery:
    limits = limits or InputLimits()
    model = _model(body)
    raw = body.get("inputs")
    texts = [raw] if isinstance(raw, str) else raw
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise bad_request(
            "`inputs` must be a string or a non-empty list of strings", param="inputs"
        )
    if len(texts) > MAX_INPUTS:
        raise bad_request(f"`inputs` has {len(texts)} items; at most {MAX_INPUTS}", param="inputs")
    for i, text in enumerate(texts):
        check_text_size(text, f"inputs[{i}]", "inputs", limits)
    return TokenizeQuery(
        model,
        list(texts),
        _flag(body, "add_special_tokens", True),
        parse_prompt_name(body),
        parse_truncation(body),
    )


def tokens_response(rows: list[Any], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
    """TEI's tokenize answer: per input, its tokens (``TokenSpans``), each with its id, text,
    whether it is special, and its characters in the input (``start``, ``stop``; null for
    special tokens and the prompt's)."""
    out = []
    for row in rows:
        tokens = []
        for token_id, text, special, span in zip(
            row.ids, row.tokens, row.special, row.spans, strict=True
        ):
            if special and not add_special_tokens:
                continue
            start, stop = span if span is not None else (None, None)
            tokens.append(
                {"id": token_id, "text": text, "special": special, "start": start, "stop": stop}
            )
        out.append(tokens)
    return out


@dataclass(frozen=True)
class DecodeQuery:
    model: str
    rows: list[list[int]]
    skip_special_tokens: bool


def parse_decode(body: Any, limits: InputLimits | None = None) -> DecodeQuery:
    limits = limits or InputLimits()
    model = _model(body)
    raw = body.get("ids")
    if isinstance(raw, list) and raw and all(is_int(x) for x in raw):
        rows = [list(raw)]
    elif (
        isinstance(raw, list)
        and raw
        and all(isinstance(r, list) and r and all(is_int(t) for t in r) for r in raw)
    ):
        rows = [list(r) for r in raw]
    else:
        raise bad_request(
            "`ids` must be a non-empty list of token ids, or a list of such lists", param="ids"
        )
    if len(rows) > MAX_INPUTS:
        raise bad_request(f"`ids` has {len(rows)} rows; at most {MAX_INPUTS}", param="ids")
    try:
        _check_token_rows(rows, limits)
    except OpenAIError as err:
        raise bad_request(err.message.replace("`input", "`ids"), param="ids") from None
    return DecodeQuery(model, rows, _flag(body, "skip_special_tokens", True))
