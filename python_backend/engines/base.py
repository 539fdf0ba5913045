"""What every engine shares: the bucket layout, and the interface the scheduler calls."""

from __future__ import annotations

import bisect
from typing import Protocol

import numpy as np

from python_backend.common.contract import (
    ENGINE_INPUTS,
    TOKEN_TYPE_INPUT,
    ids_in_vocabulary,
    split_token_types,
)
from python_backend.common.cost_models import next_captured_size
from python_backend.common.manifest import Bucket, LongRows, Manifest


class BucketLayout:
    """Length buckets and batch limits, read from the manifest: the one object that says how a
    row is padded (``pad_len``), how many rows a forward takes (``max_rows``, ``max_batch``),
    which rows may share a length (``mergeable``) and what batch really runs (``run_batch_size``).
    The planner, the engines and the cost tables all read it (``planner.PlanLayout``)."""

    def __init__(
        self,
        buckets: tuple[Bucket, ...],
        max_length: int,
        max_batch: int,
        long_rows: LongRows | None,
    ) -> None:
        self.buckets = buckets
        self.lengths = [b.length for b in buckets]
        self.max_length = max_length
        self.max_batch = max_batch
        self.long_rows = long_rows

    @classmethod
    def from_manifest(cls, manifest: Manifest) -> BucketLayout:
        return cls(manifest.buckets, manifest.max_length, manifest.max_batch, manifest.long_rows)

    def capped(self, max_batch: int) -> BucketLayout:
        """The same layout under a server cap on rows per forward (never above the engine's)."""
        return BucketLayout(
            self.buckets, self.max_length, min(max_batch, self.max_batch), self.long_rows
        )

    @property
    def longest_row(self) -> int:
        """Longest row a forward can take: the max length with a long-row profile, else the last bucket."""
        return self.max_length if self.long_rows is not None else self.lengths[-1]

    def pad_len(self, num_tokens: int) -> int:
        """The length a row runs at: its bucket, or its own length above the last bucket."""
        i = bisect.bisect_left(self.lengths, num_tokens)
        return self.lengths[i] if i < len(self.lengths) else num_tokens

    def mergeable(self, num_tokens: int) -> bool:
        return num_tokens <= self.lengths[-1]

    def max_rows(self, padded_length: int) -> int:
        """Rows one forward takes at ``padded_length``: the engine profile's batch limit, within
        ``max_batch`` (a server's cap: ``capped``)."""
        i = bisect.bisect_left(self.lengths, padded_length)
        if i < len(self.lengths):
            return min(self.max_batch, self.buckets[i].max_rows)
        if self.long_rows is None or padded_length > self.max_length:
            raise ValueError(f"no engine profile takes rows of {padded_length} tokens")
        return min(self.max_batch, self.long_rows.max_rows)

    def bucket_index(self, padded_length: int) -> int | None:
        """The bucket (and engine profile) of exactly this length; None for other lengths."""
        i = bisect.bisect_left(self.lengths, padded_length)
        return i if i < len(self.lengths) and self.lengths[i] == padded_length else None

    def run_batch_size(self, padded_length: int, num_rows: int) -> int:
        """The batch the engine really runs: the next captured size, where it captured any."""
        i = self.bucket_index(padded_length)
        if i is None:
            return num_rows
        return next_captured_size(self.buckets[i].captured_batch_sizes, num_rows)


class Engine(Protocol):
    """Runs one group of rows at one padded length. Shapes: ids, mask [B, T] int64 -> [B, D] fp32."""

    layout: BucketLayout
    output_name: str
    output_dim: int

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...

    def close(self) -> None: ...


def graph_inputs(input_ids: np.ndarray, attention_mask: np.ndarray) -> dict[str, np.ndarray]:
    """Every graph input a family may read, by name, from packed ids and the mask: the ids,
    the mask and the token types (which ride in the ids' high bits: ``contract``). An engine
    takes the ones its ``input_names`` list."""
    ids, types = split_token_types(input_ids.astype(np.int64, copy=False))
    input_ids_name, attention_mask_name = ENGINE_INPUTS
    return {
        input_ids_name: ids,
        attention_mask_name: attention_mask.astype(np.int64, copy=False),
        TOKEN_TYPE_INPUT: types,
    }


def run_rows(
    engine: Engine,
    rows: list[np.ndarray],
    padded_length: int,
    pad_token_id: int,
    vocab_size: int | None = None,
) -> np.ndarray:
    """One forward of ``rows`` right-padded to ``padded_length``: [len(rows), D] float32."""
    return run_padded(engine, *pad_rows(rows, padded_length, pad_token_id), vocab_size)


def run_padded(
    engine: Engine, ids: np.ndarray, mask: np.ndarray, vocab_size: int | None = None
) -> np.ndarray:
    """One forward of rows already padded (``pad_rows``), checked to answer every row. With
    ``vocab_size``, ids outside [0, vocab_size) are refused before the engine sees them (an
    embedding lookup past its table is an error on the CPU, and may be worse on a GPU)."""
    if vocab_size is not None and not ids_in_vocabulary(ids, vocab_size):
        raise ValueError(f"a token id lies outside the vocabulary [0, {vocab_size})")
    out = engine.run(ids, mask)
    if out.shape[0] != ids.shape[0]:
        raise RuntimeError(f"engine returned {out.shape[0]} rows for {ids.shape[0]}")
    return out


def pad_rows(
    rows: list[np.ndarray], padded_length: int, pad_token_id: int
) -> tuple[np.ndarray, np.ndarray]:
    """Right-pads token rows into (input_ids, attention_mask), both [len(rows), padded_length]."""
    ids = np.full((len(rows), padded_length), pad_token_id, dtype=np.int64)
    mask = np.zeros((len(rows), padded_length), dtype=np.int64)
    for r, row in enumerate(rows):
        ids[r, : len(row)] = row
        mask[r, : len(row)] = 1
    return ids, mask
