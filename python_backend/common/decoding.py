"""Request decoding: Triton inputs and parameters -> validated token rows, or a clear error.

Everything a client can get wrong is checked here, before a request is queued, and named in the
error: which input, which row, what is wrong and what the limit is. Nothing here touches Triton
objects, so the checks are unit-tested on plain arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from python_backend.common.contract import (
    CLASS_PARAMETER,
    CLIENT_PARAMETER,
    KEY_CLASS_PARAMETER,
    MAX_CLIENT_NAME,
    MAX_ID_COLUMNS,
    MAX_TEXT_BYTES_PER_TOKEN,
    PAIR_INPUT,
    REQUEST_INPUTS,
    TEXT_INPUTS,
    TIMINGS_PARAMETER,
    TRUNCATION_SIDES,
    Reason,
    ServeError,
    too_long_message,
)
from python_backend.common.tokenization import TextTokenizer


@dataclass(frozen=True)
class Limits:
    max_rows: int  # rows per request (the config's max_batch_size)
    max_length: int  # tokens per row the engine takes
    vocab_size: int  # token ids lie in [0, vocab_size)
    pairs: bool = False  # a pair model: each row is TEXT with its TEXT_PAIR


@dataclass(frozen=True)
class RequestOptions:
    truncate: bool  # rows over max_length: truncate, or refuse the request
    timeout_ms: int  # 0: no deadline
    prompt_name: str | None = None  # a prompt of the model's, prepended to each text row
    client: str = ""  # who sent it (CLIENT_PARAMETER): the queue is shared between clients
    truncation_side: str = "right"  # which end of an over-long row is cut (TRUNCATION_SIDES)
    normalize: bool | None = None  # embeddings at unit length, or not; None: the model's default
    timings: bool = False  # answer TIMINGS too: where the request's time went
    priority: int = 1  # its service class (CLASS_PARAMETER): 1 is served first
    instruction: str | None = None  # a decoder reranker's instruction; None: the model's own


@dataclass(frozen=True)
class Prompts:
    """The model's sentence-transformers prompts: text prepended to each text row before it is
    tokenized, chosen per request; the default applies when a request names none."""

    by_name: dict[str, str] = field(default_factory=dict)
    default_name: str | None = None

    def prefix(self, name: str | None) -> str:
        if name is None:
            return self.by_name[self.default_name] if self.default_name else ""
        if name not in self.by_name:
            known = ", ".join(sorted(self.by_name)) or "none"
            raise ServeError(
                Reason.BAD_PARAMETER,
                f"parameter prompt_name {name[:64]!r} is not a prompt of this model (its prompts: "
                f"{known})",
            )
        return self.by_name[name]


@dataclass(frozen=True)
class DecodedRequest:
    rows: list[np.ndarray]  # token ids per row, int64, each 1..max_length long
    options: RequestOptions


def parse_options(
    parameters: dict[str, Any], truncate_default: bool, timeout_default: int
) -> RequestOptions:
    truncate = parameters.get("truncate", truncate_default)
    if not isinstance(truncate, bool):
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter truncate must be a bool (true or false), got {truncate!r}",
        )
    timeout = parameters.get("timeout_ms", timeout_default)
    if isinstance(timeout, bool) or not isinstance(timeout, int) or timeout < 0:
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter timeout_ms must be a non-negative integer, got {timeout!r}",
        )
    prompt_name = parameters.get("prompt_name")
    if prompt_name is not None and not isinstance(prompt_name, str):
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter prompt_name must be a string, got {prompt_name!r:.64}",
        )
    instruction = parameters.get("instruction")
    if instruction is not None and not isinstance(instruction, str):
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter instruction must be a string, got {str(instruction)[:64]!r}",
        )
    client = parameters.get(CLIENT_PARAMETER, "")
    if not isinstance(client, str) or len(client) > MAX_CLIENT_NAME:
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter {CLIENT_PARAMETER} must be a string of at most {MAX_CLIENT_NAME} "
            "characters",
        )
    side = parameters.get("truncation_side", TRUNCATION_SIDES[0])
    if not isinstance(side, str) or side not in TRUNCATION_SIDES:
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter truncation_side must be one of {', '.join(TRUNCATION_SIDES)}, "
            f"got {str(side)[:64]!r}",
        )
    normalize = parameters.get("normalize")
    if normalize is not None and not isinstance(normalize, bool):
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter normalize must be a bool (true or false), got {str(normalize)[:64]!r}",
        )
    timings = parameters.get(TIMINGS_PARAMETER, False)
    if not isinstance(timings, bool):
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter timings must be a bool (true or false), got {str(timings)[:64]!r}",
        )
    priority = class_number(parameters.get(CLASS_PARAMETER, 0), "priority")
    key_class = class_number(parameters.get(KEY_CLASS_PARAMETER, 0), KEY_CLASS_PARAMETER) or 1
    if priority and priority < key_class:
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter priority is {priority}; this API key may ask for class {key_class} "
            "at most (or a larger number, served after it)",
        )
    return RequestOptions(
        truncate=truncate,
        timeout_ms=int(timeout),
        prompt_name=prompt_name,
        client=client,
        truncation_side=side,
        normalize=normalize,
        timings=timings,
        priority=priority or key_class,
        instruction=instruction,
    )


def class_number(value: Any, name: str) -> int:
    """A service class as the body check or the adapter writes it, or a header's text; 0: none."""
    if isinstance(value, str) and value.isascii() and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ServeError(
            Reason.BAD_PARAMETER,
            f"parameter {name} must be a class number (1 first; 0: the default), got "
            f"{str(value)[:64]!r}",
        )
    return value


@dataclass(frozen=True)
class Normalization:
    """What a model does with ``normalize``: None for models that are not embedding models."""

    default: bool | None = None  # the pipeline ends in Normalize (embedding models)
    in_graph: bool = False  # a build before manifest format 3: Normalize is inside the graph

    def applies(self, asked: bool | None) -> bool:
        """Whether the server scales this request's vectors to unit length, or a ServeError."""
        if asked is None:
            return bool(self.default) and not self.in_graph
        if self.default is None:
            raise ServeError(
                Reason.BAD_PARAMETER,
                "parameter normalize is for embedding models; this model answers other outputs",
            )
        if self.in_graph and not asked:
            raise ServeError(
                Reason.BAD_PARAMETER,
                "parameter normalize false: this build normalises inside its graph; rebuild the "
                "model with `python -m builder build` to serve raw pooled vectors",
            )
        return asked and not self.in_graph


def unit_length(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled to unit L2 norm (a zero row stays zero), as sentence-transformers'
    Normalize does."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32, copy=False)


def check_declared_shape(name: str, shape: Sequence[int], limits: Limits) -> int:
    """The rows of an input of this shape, or a ServeError naming it: [rows, 1] for text,
    [rows, tokens] for ids. Run on the shape a request declares, before its tensor is read into
    numpy, and again on the array read."""
    is_text = name in TEXT_INPUTS
    if len(shape) != 2:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input {name} must have shape [rows, {'1' if is_text else 'tokens'}], "
            f"got rank {len(shape)} shape {list(shape)}",
        )
    rows, columns = (int(d) for d in shape)
    if rows <= 0:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input {name} has zero rows",
        )
    if rows > limits.max_rows:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input {name} has {rows} rows; the limit is {limits.max_rows} per request",
        )
    if is_text and columns != 1:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input {name} must have shape [rows, 1], got {list(shape)}",
        )
    if not 0 <= columns <= MAX_ID_COLUMNS:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input {name} declares {columns} tokens a row; the limit is {MAX_ID_COLUMNS}",
        )
    return rows


def _text_rows(name: str, text: np.ndarray, limits: Limits, options: RequestOptions) -> list[str]:
    """The UTF-8 rows of a [rows, 1] BYTES input, each checked; over-long rows cut (truncate)
    or refused."""
    if text.dtype != np.object_ and text.dtype.kind not in ("S", "U"):
        raise ServeError(
            Reason.BAD_DTYPE,
            f"input {name} must be BYTES (strings), got {text.dtype}",
        )
    check_declared_shape(name, text.shape, limits)
    max_bytes = limits.max_length * MAX_TEXT_BYTES_PER_TOKEN
    texts = []
    for r, value in enumerate(text[:, 0]):
        raw = value if isinstance(value, bytes) else str(value).encode("utf-8")
        try:
            decoded = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ServeError(
                Reason.BAD_TEXT,
                f"{name} row {r} is not valid UTF-8 (byte {err.start})",
            ) from None
        if not decoded.strip():
            raise ServeError(
                Reason.EMPTY_ROW,
                f"{name} row {r} is empty",
            )
        if len(raw) > max_bytes:
            if not options.truncate:
                raise ServeError(
                    Reason.TOO_LONG,
                    f"{name} row {r} is {len(raw)} bytes, far over the {limits.max_length}-token "
                    f"limit (truncate is off)",
                )
            # the end truncation cuts would be cut away anyway
            left = options.truncation_side == "left"
            decoded = decoded[-max_bytes:] if left else decoded[:max_bytes]
        texts.append(decoded)
    return texts


def decode_text(
    text: np.ndarray,
    tokenizer: TextTokenizer,
    limits: Limits,
    options: RequestOptions,
    prompts: Prompts | None = None,
    pair: np.ndarray | None = None,
) -> list[np.ndarray]:
    if options.instruction is not None and tokenizer.template is None:
        raise ServeError(
            Reason.BAD_PARAMETER,
            "parameter instruction is for decoder rerankers (a prompt template); this model has "
            "none",
        )
    if options.instruction is not None:
        size = len(options.instruction.encode("utf-8", "surrogatepass"))
        if size > limits.max_length * MAX_TEXT_BYTES_PER_TOKEN:
            raise ServeError(
                Reason.BAD_PARAMETER,
                f"parameter instruction is {size} bytes, far over what a row of "
                f"{limits.max_length} tokens holds",
            )
    prefix = (prompts or Prompts()).prefix(options.prompt_name)
    texts = [prefix + t for t in _text_rows("TEXT", text, limits, options)]
    if pair is not None and pair.shape != text.shape:
        raise ServeError(
            Reason.BAD_SHAPE,
            f"input TEXT_PAIR must have TEXT's shape {list(text.shape)}, got {list(pair.shape)}",
        )
    if pair is not None and tokenizer.template is not None:
        try:
            rows = tokenizer.encode_template(
                texts,
                _text_rows("TEXT_PAIR", pair, limits, options),
                options.truncate,
                options.truncation_side,
                options.instruction,
            )
        except ValueError as err:
            raise ServeError(Reason.TOO_LONG, str(err)) from None
    elif pair is not None:
        rows = tokenizer.encode_pairs(
            texts,
            _text_rows("TEXT_PAIR", pair, limits, options),
            options.truncate,
            options.truncation_side,
        )
    else:
        rows = tokenizer.encode(
            texts, options.truncate, options.truncation_side, prompt_chars=len(prefix)
        )
    for r, ids in enumerate(rows):
        if len(ids) == 0:
            raise ServeError(
                Reason.EMPTY_ROW,
                f"TEXT row {r} has no tokens",
            )
        if len(ids) > limits.max_length:
            raise ServeError(
                Reason.TOO_LONG, too_long_message("TEXT", r, len(ids), limits.max_length)
            )
    return rows


def decode_ids(
    ids: np.ndarray, mask: np.ndarray | None, limits: Limits, options: RequestOptions
) -> list[np.ndarray]:
    if ids.dtype != np.int64:
        raise ServeError(
            Reason.BAD_DTYPE,
            f"input INPUT_IDS must be INT64, got {ids.dtype}",
        )
    num_rows = check_declared_shape("INPUT_IDS", ids.shape, limits)
    if ids.shape[1] == 0:
        raise ServeError(
            Reason.EMPTY_ROW,
            "input INPUT_IDS has empty rows (zero tokens)",
        )
    if ids.size and (ids.min() < 0 or ids.max() >= limits.vocab_size):
        bad = np.argwhere((ids < 0) | (ids >= limits.vocab_size))[0]
        raise ServeError(
            Reason.BAD_TOKEN,
            f"INPUT_IDS row {bad[0]} token {bad[1]} is {ids[bad[0], bad[1]]}; ids must lie in "
            f"[0, {limits.vocab_size})",
        )
    if mask is None:
        lengths = np.full(num_rows, ids.shape[1])
    else:
        if mask.dtype != np.int64:
            raise ServeError(
                Reason.BAD_DTYPE,
                f"input ATTENTION_MASK must be INT64, got {mask.dtype}",
            )
        if mask.shape != ids.shape:
            raise ServeError(
                Reason.BAD_SHAPE,
                f"input ATTENTION_MASK has shape {list(mask.shape)}; it must match INPUT_IDS "
                f"{list(ids.shape)}",
            )
        if not np.isin(mask, (0, 1)).all():
            raise ServeError(
                Reason.BAD_MASK,
                "input ATTENTION_MASK may hold only 0 and 1",
            )
        lengths = mask.sum(axis=1)
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise ServeError(
                Reason.EMPTY_ROW,
                f"ATTENTION_MASK row {empty[0]} is all zeros: the row has no tokens",
            )
        # right padding: ones then zeros, so each row's real tokens are a prefix
        prefix = np.arange(ids.shape[1])[None, :] < lengths[:, None]
        ragged = np.flatnonzero((mask == 1) != prefix)
        if ragged.size:
            raise ServeError(
                Reason.BAD_MASK,
                f"ATTENTION_MASK row {ragged[0] // ids.shape[1]} is not right-padded (ones, then zeros)",
            )
    too_long = np.flatnonzero(lengths > limits.max_length)
    if too_long.size and not options.truncate:
        r = int(too_long[0])
        raise ServeError(
            Reason.TOO_LONG,
            too_long_message("INPUT_IDS", r, int(lengths[r]), limits.max_length),
        )
    # copies: Triton's input buffers are not ours once execute returns; an over-long row keeps
    # its first ids, or its last with truncation_side left
    keep_last = options.truncation_side == "left"
    rows = []
    for r in range(num_rows):
        end = int(lengths[r])
        start = max(0, end - limits.max_length) if keep_last else 0
        rows.append(ids[r, start : min(end, start + limits.max_length)].copy())
    return rows


def decode_request(
    inputs: dict[str, np.ndarray],
    options: RequestOptions,
    tokenizer: TextTokenizer,
    limits: Limits,
    prompts: Prompts | None = None,
) -> DecodedRequest:
    """Validated token rows of one request; raises ServeError naming what is wrong."""
    text, ids, mask = (inputs.get(name) for name in REQUEST_INPUTS)
    pair = inputs.get(PAIR_INPUT)
    if limits.pairs and (text is None or pair is None):
        raise ServeError(
            Reason.BAD_INPUTS,
            "this model scores pairs: send TEXT and TEXT_PAIR (one pair per row)",
        )
    if pair is not None and not limits.pairs:
        raise ServeError(
            Reason.BAD_INPUTS,
            "TEXT_PAIR is for pair models (rerankers); this model takes TEXT",
        )
    if text is not None and ids is not None:
        raise ServeError(
            Reason.BAD_INPUTS,
            "send exactly one of TEXT or INPUT_IDS, not both",
        )
    if text is None and ids is None:
        raise ServeError(
            Reason.BAD_INPUTS,
            "missing input: send TEXT or INPUT_IDS",
        )
    if text is not None:
        if mask is not None:
            raise ServeError(
                Reason.BAD_INPUTS,
                "ATTENTION_MASK goes with INPUT_IDS, not TEXT",
            )
        rows = decode_text(text, tokenizer, limits, options, prompts, pair)
    else:
        assert ids is not None
        if options.prompt_name is not None:
            raise ServeError(
                Reason.BAD_PARAMETER,
                "parameter prompt_name applies to TEXT input; INPUT_IDS are taken as already "
                "prompted",
            )
        if options.instruction is not None:
            raise ServeError(
                Reason.BAD_PARAMETER,
                "parameter instruction applies to TEXT input; INPUT_IDS are taken as already "
                "templated",
            )
        rows = decode_ids(ids, mask, limits, options)
    return DecodedRequest(rows=rows, options=options)
