"""Text to token rows with the model's own tokenizer (Hugging Face `tokenizers`).

Padding is the engine's business (rows are padded to their bucket), so the tokenizer never pads.
Views of one tokenizer: two truncate at the served limit (special tokens kept in place), one
from the right (the default) and one from the left; one does not truncate, so that a request with
truncate off can be refused with the row's real length.

A text with a prompt truncated from the left keeps its prompt: the row is tokenized whole, then
its text tokens are cut from the left, the special tokens and the prompt's tokens staying (from
the right, the tokenizer's own truncation already keeps the prompt at the start).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from python_backend.common.contract import RerankTemplate, pack_token_types


@dataclass(frozen=True)
class TokenSpans:
    """One row's tokens as the model counts them, with what each is: its id, its text, whether
    it is a special token, and the characters of the input it came from (None for special
    tokens and for the prompt's, which are not in the input)."""

    ids: list[int]
    tokens: list[str]
    special: list[bool]
    spans: list[tuple[int, int] | None]


def longest_first(first: int, second: int, budget: int) -> tuple[int, int]:
    """How many tokens of each of two texts stay within ``budget``, cut longest first as the
    Hugging Face fast tokenizers cut a pair: the longer alone while the shorter fits in half,
    else each to half (the odd token to the longer, to the second on a tie)."""
    if first + second <= budget:
        return first, second
    short, long_ = sorted((first, second))
    long_ = short if short > budget else max(short, budget - short)
    if short + long_ > budget:
        short, long_ = budget // 2, budget // 2 + budget % 2
    return (long_, short) if first > second else (short, long_)


class TextTokenizer:
    def __init__(self, path: Path, max_length: int, template: RerankTemplate | None = None) -> None:
        self.max_length = max_length
        self.template = template
        self._truncating = {side: Tokenizer.from_file(str(path)) for side in ("right", "left")}
        for side, tokenizer in self._truncating.items():
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length, direction=side)
        self._whole = Tokenizer.from_file(str(path))
        self._whole.no_padding()
        self._whole.no_truncation()

    def start_workers(self) -> None:
        """Starts the tokenizer's worker pool (one per process, started by its first batch,
        which spreads over it where it holds more than one text; ``cpu_pinning.with_every_core``
        says why a pinned process starts it on purpose)."""
        self._truncating["right"].encode_batch(["", ""])

    def encode(
        self, texts: list[str], truncate: bool, side: str = "right", prompt_chars: int = 0
    ) -> list[np.ndarray]:
        """Token ids per text, int64; with truncate off, rows may exceed ``max_length``. Rows
        over it lose text tokens from ``side``; the first ``prompt_chars`` characters of each
        text are its prompt, kept whole."""
        if truncate and side == "left" and prompt_chars:
            return [
                np.asarray(e.ids, dtype=np.int64)[self._kept(e, prompt_chars, side)]
                for e in self._whole.encode_batch(texts)
            ]
        tokenizer = self._truncating[side] if truncate else self._whole
        return [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)]

    def encode_pairs(
        self, texts: list[str], pairs: list[str], truncate: bool, side: str = "right"
    ) -> list[np.ndarray]:
        """Each (text, pair) as one row, with its token types packed into the ids (contract);
        truncation takes tokens from the longer of the two first, at ``side``."""
        tokenizer = self._truncating[side] if truncate else self._whole
        return [
            pack_token_types(np.asarray(e.ids), np.asarray(e.type_ids))
            for e in tokenizer.encode_batch(list(zip(texts, pairs, strict=True)))
        ]

    def encode_template(
        self,
        queries: list[str],
        documents: list[str],
        truncate: bool,
        side: str = "right",
        instruction: str | None = None,
    ) -> list[np.ndarray]:
        """Each (query, document) as a decoder reranker's row: the template's prefix, its body
        with the pair filled in (tokenized as one text, as the model's own recipe does), its
        suffix. Over ``max_length``, the query's and the document's tokens are cut longest first
        from ``side``; the template's own tokens always stay."""
        template = self.template
        assert template is not None
        instruction = template.instruction if instruction is None else instruction
        filled = [
            template.parts(q, d, instruction) for q, d in zip(queries, documents, strict=True)
        ]
        prefix = np.asarray(template.prefix_ids, dtype=np.int64)
        suffix = np.asarray(template.suffix_ids, dtype=np.int64)
        fixed = len(prefix) + len(suffix)
        rows = []
        for encoding, (_, query, document) in zip(
            self._whole.encode_batch([text for text, _, _ in filled]), filled, strict=True
        ):
            ids = np.asarray(encoding.ids, dtype=np.int64)
            if truncate and fixed + len(ids) > self.max_length:
                starts = np.asarray([a for a, _ in encoding.offsets])
                ends = np.asarray([b for _, b in encoding.offsets])
                special = np.asarray(encoding.special_tokens_mask, dtype=bool)
                # a token with any character of the template's own stays with the template
                in_query = ~special & (starts >= query[0]) & (ends <= query[1])
                in_document = ~special & (starts >= document[0]) & (ends <= document[1])
                sizes = int(in_query.sum()), int(in_document.sum())
                own = len(ids) - sum(sizes)
                budget = self.max_length - fixed - own
                if budget < 2:
                    raise ValueError(
                        f"the rerank template and its instruction take {fixed + own} of the "
                        f"{self.max_length} tokens a row holds"
                    )
                kept = ~(in_query | in_document)
                counts = longest_first(*sizes, budget)
                for part, count in zip((in_query, in_document), counts, strict=True):
                    if count:
                        where = np.flatnonzero(part)
                        kept[where[-count:] if side == "left" else where[:count]] = True
                ids = ids[kept]
            rows.append(np.concatenate([prefix, ids, suffix]))
        return rows

    def spans(
        self,
        texts: list[str],
        truncate: bool,
        side: str = "right",
        prompt: str = "",
        max_tokens: int | None = None,
    ) -> list[TokenSpans]:
        """Each text's tokens with ``prompt`` before it, cut as ``encode`` cuts them (the ids are
        ``encode``'s), and where each token lies in the text (``/v1/tokenize``); past
        ``max_tokens`` in all, a ValueError before any is described."""
        out = []
        shift = len(prompt)
        encodings = self._whole.encode_batch([prompt + t for t in texts])
        if max_tokens is not None:
            count = sum(min(len(e), self.max_length) if truncate else len(e) for e in encodings)
            if count > max_tokens:
                raise ValueError(f"{count} tokens; at most {max_tokens} a request")
        for encoding in encodings:
            # each property of a Rust Encoding builds its whole list anew: read each once
            ids, tokens, offsets = encoding.ids, encoding.tokens, encoding.offsets
            special = encoding.special_tokens_mask
            kept = (
                np.flatnonzero(self._kept(encoding, shift, side)).tolist()
                if truncate
                else range(len(ids))
            )
            out.append(
                TokenSpans(
                    ids=[ids[i] for i in kept],
                    tokens=[tokens[i] for i in kept],
                    special=[bool(special[i]) for i in kept],
                    spans=[
                        None
                        if special[i] or offsets[i][0] < shift
                        else (offsets[i][0] - shift, offsets[i][1] - shift)
                        for i in kept
                    ],
                )
            )
        return out

    def decode(self, rows: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each row of token ids."""
        return list(self._whole.decode_batch(rows, skip_special_tokens=skip_special_tokens))

    def _kept(self, encoding: Any, prompt_chars: int, side: str) -> np.ndarray:
        """Which of the encoding's tokens a row within ``max_length`` keeps: every special token
        and the prompt's (those starting in its first ``prompt_chars`` characters), and as many
        text tokens as fit, from the end away from ``side``."""
        count = len(encoding.ids)
        if count <= self.max_length:
            return np.ones(count, dtype=bool)
        special = np.asarray(encoding.special_tokens_mask, dtype=bool)
        starts = np.asarray([start for start, _ in encoding.offsets])
        kept = special | (starts < prompt_chars)
        budget = self.max_length - int(kept.sum())
        if budget <= 0:  # the prompt alone fills the row: cut as the tokenizer would
            return np.arange(count) < self.max_length
        text = np.flatnonzero(~kept)
        kept[text[-budget:] if side == "left" else text[:budget]] = True
        return kept
