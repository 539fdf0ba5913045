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

from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer

from python_backend.contract import pack_token_types


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        self.max_length = max_length
        self._truncating = {side: Tokenizer.from_file(str(path)) for side in ("right", "left")}
        for side, tokenizer in self._truncating.items():
            tokenizer.no_padding()
            tokenizer.enable_truncation(max_length, direction=side)
        self._whole = Tokenizer.from_file(str(path))
        self._whole.no_padding()
        self._whole.no_truncation()

    def encode(
        self, texts: list[str], truncate: bool, side: str = "right", prompt_chars: int = 0
    ) -> list[np.ndarray]:
        """Token ids per text, int64; with truncate off, rows may exceed ``max_length``. Rows
        over it lose text tokens from ``side``; the first ``prompt_chars`` characters of each
        text are its prompt, kept whole."""
        if truncate and side == "left" and prompt_chars:
            return [
                self._cut_text_tokens(e, prompt_chars, side)
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

    def _cut_text_tokens(self, encoding: Any, prompt_chars: int, side: str) -> np.ndarray:
        """The encoding's ids within ``max_length``: special tokens and the prompt's tokens
        (those starting in its first ``prompt_chars`` characters) kept, text tokens cut from
        ``side``."""
        ids = np.asarray(encoding.ids, dtype=np.int64)
        if len(ids) <= self.max_length:
            return ids
        special = np.asarray(encoding.special_tokens_mask, dtype=bool)
        starts = np.asarray([start for start, _ in encoding.offsets])
        kept = special | (starts < prompt_chars)
        budget = self.max_length - int(kept.sum())
        if budget <= 0:  # the prompt alone fills the row: cut as the tokenizer would
            return ids[: self.max_length]
        text = np.flatnonzero(~kept)
        kept[text[-budget:] if side == "left" else text[:budget]] = True
        return ids[kept]
