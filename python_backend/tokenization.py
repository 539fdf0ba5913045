"""Text to token rows with the model's own tokenizer (Hugging Face `tokenizers`).

Padding is the engine's business (rows are padded to their bucket), so the tokenizer never pads.
Two views of one tokenizer: one truncates at the served limit (special tokens kept in place), one
does not, so that a request with truncate off can be refused with the row's real length.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from python_backend.contract import pack_token_types


class TextTokenizer:
    def __init__(self, path: Path, max_length: int) -> None:
        self.max_length = max_length
        self._truncating = Tokenizer.from_file(str(path))
        self._truncating.no_padding()
        self._truncating.enable_truncation(max_length)
        self._whole = Tokenizer.from_file(str(path))
        self._whole.no_padding()
        self._whole.no_truncation()

    def encode(self, texts: list[str], truncate: bool) -> list[np.ndarray]:
        """Token ids per text, int64; with truncate off, rows may exceed ``max_length``."""
        tokenizer = self._truncating if truncate else self._whole
        return [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)]

    def encode_pairs(self, texts: list[str], pairs: list[str], truncate: bool) -> list[np.ndarray]:
        """Each (text, pair) as one row, with its token types packed into the ids (contract);
        truncation takes tokens from the longer of the two first."""
        tokenizer = self._truncating if truncate else self._whole
        return [
            pack_token_types(np.asarray(e.ids), np.asarray(e.type_ids))
            for e in tokenizer.encode_batch(list(zip(texts, pairs, strict=True)))
        ]
