"""What the builder and the server agree on, in one place: tensor names, each family's output and
graph inputs, request limits, and why a request gets no outputs (reasons, kinds, the one error
type). Both import this module; it imports nothing of theirs. (Model settings and their defaults
are declared in ``settings``.)
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

import numpy as np

# -- the engine graph (ONNX export, ONNX Runtime, TensorRT profiles) --------------------------

# the graph's inputs, in order: [B, T] int64 each. Padding, the engines and the load-time I/O
# check take inputs by these names, so a family with a third input only extends this list.
ENGINE_INPUTS: tuple[str, ...] = ("input_ids", "attention_mask")
# the third input of pair models (cross-encoders): [B, T] int64, 0 for the first text's tokens
# and 1 for the second's. Inside the server a row stays one int64 array: a token's type rides in
# the bits above TOKEN_TYPE_SHIFT of its id (ids are far below 2**32), so queueing, planning and
# padding are the same for every family; the engines split the two before the graph sees them.
TOKEN_TYPE_INPUT = "token_type_ids"
TOKEN_TYPE_SHIFT = 32
_ID_BITS = (1 << TOKEN_TYPE_SHIFT) - 1


def pack_token_types(ids: np.ndarray, types: np.ndarray) -> np.ndarray:
    """One int64 row: each token's id, its type in the bits above TOKEN_TYPE_SHIFT."""
    return ids.astype(np.int64) | (types.astype(np.int64) << TOKEN_TYPE_SHIFT)


def split_token_types(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ids, token types) of packed rows; rows without types give types of 0."""
    return packed & _ID_BITS, packed >> TOKEN_TYPE_SHIFT


def ids_in_vocabulary(packed: np.ndarray, vocab_size: int) -> bool:
    """Whether every id of packed int64 rows lies in [0, vocab_size): one pass where the rows
    carry no token types (read unsigned, a negative id lies past any vocabulary), the ids' own
    bits where they do."""
    if not packed.size or int(packed.view(np.uint64).max()) < vocab_size:
        return True
    return bool((packed >= 0).all()) and int((packed & _ID_BITS).max()) < vocab_size


# the graph's one output, [B, D] float32, is named after what the model serves (FAMILY_OUTPUTS)

# -- the Triton model's interface -------------------------------------------------------------

REQUEST_INPUTS: tuple[str, ...] = ("TEXT", "INPUT_IDS", "ATTENTION_MASK")
PAIR_INPUT = "TEXT_PAIR"  # pair models: the second text of each row, beside TEXT
TEXT_INPUTS = frozenset({REQUEST_INPUTS[0], PAIR_INPUT})  # [rows, 1] BYTES; the others [rows, T]
NUM_TOKENS_OUTPUT = "NUM_TOKENS"  # [rows, 1] int32: tokens each row used, after truncation
# [rows, 3] fp32, answered only to a request with the parameter timings true: the seconds its
# request spent queued in the model, tokenizing and computing (the same on each of its rows)
TIMINGS_OUTPUT = "TIMINGS"
TIMINGS_PARAMETER = "timings"
TIMINGS_STAGES = ("queue", "tokenization", "inference")


@dataclass(frozen=True)
class FamilyContract:
    """What the server knows of a model family: the one float output it serves, and the graph's
    inputs (a family with token types takes TEXT_PAIR beside TEXT). The builder's family table
    (``builder.families.FAMILY_TABLE``) adds how each is detected, wrapped and checked."""

    output_name: str
    input_names: tuple[str, ...] = ENGINE_INPUTS

    @property
    def takes_pairs(self) -> bool:
        return TOKEN_TYPE_INPUT in self.input_names


FAMILY_CONTRACTS: dict[str, FamilyContract] = {
    "embedding": FamilyContract("EMBEDDING"),
    "classifier": FamilyContract("LOGITS"),
    "decoder": FamilyContract("LOGITS"),
    # cross-encoders: a relevance logit per (text, text pair)
    "reranker": FamilyContract("SCORE", (*ENGINE_INPUTS, TOKEN_TYPE_INPUT)),
    # causal LMs that judge a (query, document) pair in a prompt template (RerankTemplate): the
    # "yes" logit less the "no" logit at the last token, whose sigmoid is P(yes | yes or no)
    "decoder_reranker": FamilyContract("SCORE"),
}


@dataclass(frozen=True)
class RerankTemplate:
    """How a decoder reranker reads a (query, document) pair: ``prefix_ids``, then ``body``
    (``{instruction}``, ``{query}`` and ``{document}`` filled in) tokenized as one text, then
    ``suffix_ids``; ``instruction``: the default, a request may name its own. ``yes_id`` and
    ``no_id`` are the tokens whose last-position logits the graph compares."""

    prefix_ids: tuple[int, ...]
    body: str
    suffix_ids: tuple[int, ...]
    instruction: str
    yes_id: int
    no_id: int

    @cached_property
    def pieces(self) -> tuple[tuple[str, str | None], ...]:
        """The body as (literal text, the field after it or None), parsed once."""
        try:
            parsed = string.Formatter().parse(self.body)
            return tuple((literal, name) for literal, name, _, _ in parsed)
        except ValueError as err:
            raise ValueError(f"the rerank template's body is not a format string: {err}") from None

    def __post_init__(self) -> None:
        names = [name for _, name in self.pieces if name is not None]
        if sorted(names) not in (["document", "query"], ["document", "instruction", "query"]):
            raise ValueError(
                "the rerank template's body must hold {query} and {document} once each, and "
                f"{{instruction}} at most once, and nothing else in braces; it holds {names}"
            )

    def parts(
        self, query: str, document: str, instruction: str
    ) -> tuple[str, tuple[int, int], tuple[int, int]]:
        """The body with the pair filled in, and the characters the query and the document
        take in it."""
        text, spans = "", {}
        for literal, name in self.pieces:
            text += literal
            if name is None:
                continue
            value = {"query": query, "document": document, "instruction": instruction}[name]
            spans[name] = (len(text), len(text) + len(value))
            text += value
        return text, spans["query"], spans["document"]


FAMILIES: tuple[str, ...] = tuple(FAMILY_CONTRACTS)
FAMILY_OUTPUTS: dict[str, str] = {name: f.output_name for name, f in FAMILY_CONTRACTS.items()}

# -- the split layout: fronts and a queue owner per GPU (python_backend/split_models.py) ------

OWNER_SUFFIX = "_owner"  # the queue owner of model M is the model M_owner
OWNER_PARAMETER = "queue_owner"  # a front's config parameter: its owner model's name
SERVES_PARAMETER = "serves"  # an owner's config parameter: the front model whose files it runs

# -- request limits ---------------------------------------------------------------------------

MAX_ROWS_PER_REQUEST = 64  # Triton's max_batch_size for every model the builder writes
# a text row longer than this many bytes per allowed token is refused before tokenizing: a token
# covers at least one character and real text averages 4-5 per token, so such a row cannot be
# meant for this model, and tokenizing it would stall every other request
MAX_TEXT_BYTES_PER_TOKEN = 32
# token ids one INPUT_IDS row may declare: checked on the declared shape before the tensor is
# read (with truncate on, longer rows than the engine takes are cut, but none this long)
MAX_ID_COLUMNS = 65536
# who sent a request, for the queue's shares (fair_queue): the front door sets this header from
# the client's address, over anything the client sent; Triton forwards it as a request parameter
# of the same name (--http-header-forward-pattern, --grpc-header-forward-pattern)
CLIENT_PARAMETER = "x-planner-client"
# a request's service class (1 first; Scheduler, ServiceClasses): the body check writes it from
# a KServe request's `priority` (which Triton consumes itself and never hands to a model), the
# OpenAI adapter from `/v1`'s `priority`; a client may not send it
CLASS_PARAMETER = "x-planner-class"
# the highest class a client's API key may ask for (API_KEYS' third word), and its default class:
# a header the front door sets from the key, over anything the client sent (none: class 1)
KEY_CLASS_PARAMETER = "x-planner-key-class"
MAX_CLIENT_NAME = 256  # characters
# which end of a row over the max length is cut (request parameter truncation_side): the text's
# tokens go from that end; special tokens and the prompt stay
TRUNCATION_SIDES = ("right", "left")


def too_long_message(input_name: str, row: int, tokens: int, limit: int) -> str:
    """The refusal of a row over the max length with truncate off; ``TOO_LONG_ROW`` reads it
    back (the OpenAI adapter names the client's input from it)."""
    return (
        f"{input_name} row {row} is {tokens} tokens; the limit is {limit} "
        "(send truncate=true to cut it)"
    )


TOO_LONG_ROW = re.compile(r"^\w+ row (\d+) is (\d+) tokens; the limit is (\d+) ")

# -- why a request got no outputs -------------------------------------------------------------


class ErrorKind(str, Enum):
    """What kind of failure an answer reports, and the status it is sent with."""

    INVALID = "invalid"  # the request itself is wrong: 400 / INVALID_ARGUMENT
    QUEUE_FULL = "queue_full"  # 503 / UNAVAILABLE: retry later
    TIMEOUT = "timeout"  # its deadline passed before it ran: 503 / UNAVAILABLE
    CANCELLED = "cancelled"  # the client went away: CANCELLED
    FAILED = "failed"  # a forward failed even for the row alone: 500 / INTERNAL
    SHUTDOWN = "shutdown"  # the server is stopping: 503 / UNAVAILABLE

    @property
    def triton_code(self) -> str:
        """The name of the ``pb_utils.TritonError`` code it is sent with."""
        return _TRITON_CODES[self]


class Reason(str, Enum):
    """Every reason a request is refused or fails, closed: its value is the ``reason`` label of
    ``planner_refused_total`` (so this is the label set) and it has one kind, so one status.
    docs/RELIABILITY.md's table of refusals lists exactly these (a test compares them)."""

    BAD_INPUTS = "bad_inputs"  # the wrong set of inputs: none, both TEXT and INPUT_IDS, ...
    BAD_SHAPE = "bad_shape"  # an input's shape: rank, zero rows, too many rows, pairs unequal
    BAD_DTYPE = "bad_dtype"  # an input's datatype
    BAD_TEXT = "bad_text"  # text that is not UTF-8
    EMPTY_ROW = "empty_row"  # a row with no text or no tokens
    TOO_LONG = "too_long"  # a row over the max length with truncate off
    BAD_TOKEN = "bad_token"  # a token id outside the vocabulary
    BAD_MASK = "bad_mask"  # an attention mask that is not ones then zeros
    BAD_PARAMETER = "bad_parameter"  # a request parameter: its type, value or prompt name
    QUEUE_FULL = "queue_full"  # the model's queue holds its limit of rows
    TIMEOUT = "timeout"  # the request's deadline passed before it ran
    CANCELLED = "cancelled"  # the client cancelled it
    SHUTDOWN = "shutdown"  # the model is stopping
    OWNER_LOST = "owner_lost"  # the queue owner (or a stalled front) dropped it: retry
    FORWARD_FAILED = "forward_failed"  # a forward failed even for one row alone
    NON_FINITE = "non_finite"  # the engine's output for a row was NaN or infinite, even alone
    INTERNAL = "internal"  # a bug in the server (decoding or scheduling): never the client's

    @property
    def kind(self) -> ErrorKind:
        return _KINDS.get(self, ErrorKind.INVALID)


_KINDS = {
    Reason.QUEUE_FULL: ErrorKind.QUEUE_FULL,
    Reason.TIMEOUT: ErrorKind.TIMEOUT,
    Reason.CANCELLED: ErrorKind.CANCELLED,
    Reason.SHUTDOWN: ErrorKind.SHUTDOWN,
    Reason.OWNER_LOST: ErrorKind.SHUTDOWN,
    Reason.FORWARD_FAILED: ErrorKind.FAILED,
    Reason.NON_FINITE: ErrorKind.FAILED,
    Reason.INTERNAL: ErrorKind.FAILED,
}


class ServeError(Exception):
    """Why a request got no outputs: the one error type of the request path, refused at decode
    or failed later. ``str(error)`` is the message the client reads."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason = reason

    @property
    def kind(self) -> ErrorKind:
        return self.reason.kind


# how long a stopping model instance keeps answering what it queued (finalize), on top of
# Triton's own exit timeout; deployments size their grace periods from both
SHUTDOWN_DRAIN_S = 30.0
# the metric the autoscalers scale on: rows waiting in one instance's queue (a gauge)
QUEUE_DEPTH_METRIC = "planner_queue_rows"
# the label naming the model instance on every planner metric: not `instance`, which Prometheus
# sets itself on every scraped series (the target's address) and would overwrite or rename
INSTANCE_LABEL = "model_instance"

_TRITON_CODES = {
    ErrorKind.INVALID: "INVALID_ARG",
    ErrorKind.QUEUE_FULL: "UNAVAILABLE",
    ErrorKind.TIMEOUT: "UNAVAILABLE",
    ErrorKind.CANCELLED: "CANCELLED",
    ErrorKind.FAILED: "INTERNAL",
    ErrorKind.SHUTDOWN: "UNAVAILABLE",
}
