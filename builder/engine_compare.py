"""An engine's outputs against a reference engine's, over every size the server runs: each
captured batch size of each bucket, the sizes without a graph, the captured sizes again, and
the long-row profile. Shared by the TensorRT check (``builder.gpu_check``) and the torch
engine's (``builder.torch_check``); the unit tests drive it on the CPU with ONNX Runtime on
both sides.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from python_backend.common.contract import pack_token_types
from python_backend.common.manifest import Manifest
from python_backend.engines.base import Engine, pad_rows

# FP16 TensorRT against FP32 ONNX Runtime, per row; the decoder's vocabulary logits of a random
# model are the least robust to FP16 rounding
MIN_COSINE = {
    "embedding": 0.999,
    "classifier": 0.999,
    "decoder": 0.995,
    "reranker": 0.999,
    "decoder_reranker": 0.995,
}
# a reranker's output is one number, whose cosine is only its sign: compare the difference
MAX_SCORE_DIFF = 0.02
ROWS_PER_CHECK = 64  # rows compared at a size larger than this: the first 64 (all are run)

# the builder's check of a GPU build (``builder.build.check_built_engine``): the engine against
# the model in FP32 on the CPU, per row, by the precision it runs in. FP32 on a GPU takes FP16's
# bounds (TensorRT computes FP32 layers in TF32, which keeps FP16's 10 bits of mantissa); BF16
# keeps 7, so its outputs drift further from FP32, while an overflowed or broken engine's fall
# far below any of these
REFERENCE_MIN_COSINE = {
    "fp32": MIN_COSINE,
    "fp16": MIN_COSINE,
    "bf16": {
        "embedding": 0.99,
        "classifier": 0.99,
        "decoder": 0.98,
        "reranker": 0.99,
        "decoder_reranker": 0.98,
    },
}
# a single score (a reranker's): its difference, relative to the score where that is above 1
REFERENCE_MAX_SCORE_DIFF = {"fp32": MAX_SCORE_DIFF, "fp16": MAX_SCORE_DIFF, "bf16": 0.06}


@dataclass(frozen=True)
class Comparison:
    phase: str  # captured | eager | captured-again | long-rows
    length: int  # padded length the rows ran at
    batch: int  # rows in the forward
    min_cosine: float
    max_abs_diff: float
    ok: bool


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    return np.sum(a * b, axis=1) / np.maximum(norms, 1e-30)


def random_rows(
    rng: np.random.Generator,
    count: int,
    shortest: int,
    longest: int,
    vocab: int,
    pairs: bool = False,
) -> list[np.ndarray]:
    """Random token rows; for pair models the second half of each row is the pair (type 1)."""
    lengths = rng.integers(shortest, longest + 1, size=count)
    rows = [rng.integers(1000, min(vocab, 29000), n).astype(np.int64) for n in lengths]
    if pairs:
        rows = [pack_token_types(r, np.arange(len(r)) >= len(r) // 2) for r in rows]
    return rows


def uncaptured_sizes(captured: tuple[int, ...], max_rows: int) -> list[int]:
    """The smallest and the largest batch size of the bucket that have no graph (none, one or
    two sizes): ``run_eagerly`` runs them at exactly that size."""
    sizes = [size for size in range(1, max_rows + 1) if size not in captured]
    return sorted({sizes[0], sizes[-1]}) if sizes else []


def check_engine(
    candidate: Engine,
    reference: Engine,
    manifest: Manifest,
    min_cosine: float,
    rng: np.random.Generator,
    run_eagerly: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
    max_score_diff: float = MAX_SCORE_DIFF,
) -> list[Comparison]:
    """Compares ``candidate`` with ``reference`` over every size the server runs (above); a
    single score by its difference, at most ``max_score_diff``."""
    results: list[Comparison] = []
    eager = run_eagerly or candidate.run
    pairs = manifest.takes_pairs

    def compare(phase: str, rows: list[np.ndarray], length: int, fn: Any) -> None:
        ids, mask = pad_rows(rows, length, manifest.pad_token_id)
        got = fn(ids, mask)[:ROWS_PER_CHECK]
        want = reference.run(ids[:ROWS_PER_CHECK], mask[:ROWS_PER_CHECK])
        cosine = float(cosine_rows(got, want).min())
        diff = float(np.abs(got - want).max())
        close = diff <= max_score_diff if got.shape[1] == 1 else cosine >= min_cosine
        ok = bool(np.isfinite(got).all()) and close
        results.append(Comparison(phase, length, len(rows), cosine, diff, ok))

    def captured_pass(phase: str) -> None:
        previous = 0
        for bucket in manifest.buckets:
            for batch in bucket.captured_batch_sizes or (bucket.max_rows,):
                rows = random_rows(
                    rng, batch, previous + 1, bucket.length, manifest.vocab_size, pairs
                )
                compare(phase, rows, bucket.length, candidate.run)
            previous = bucket.length

    captured_pass("captured")
    previous = 0
    for bucket in manifest.buckets:
        for size in uncaptured_sizes(bucket.captured_batch_sizes, bucket.max_rows):
            rows = random_rows(rng, size, previous + 1, bucket.length, manifest.vocab_size, pairs)
            compare("eager", rows, bucket.length, eager)
        previous = bucket.length
    captured_pass("captured-again")
    if manifest.long_rows is not None:
        last = manifest.last_bucket
        for length in sorted({last + 1, (last + manifest.max_length) // 2, manifest.max_length}):
            batch = min(manifest.long_rows.max_rows, 8)
            rows = random_rows(rng, batch, length, length, manifest.vocab_size, pairs)
            compare("long-rows", rows, length, candidate.run)
    return results


@dataclass(frozen=True)
class Verdict:
    """The built engine's outputs against the reference's, row by row."""

    rows: int
    non_finite_rows: int  # rows with an inf or a NaN in the engine's output
    bad_rows: int  # rows non-finite or beyond the tolerance
    worst: float  # the lowest cosine, or for single scores the largest relative difference
    bound: float  # the tolerance: the least cosine, or the largest relative difference
    scores: bool  # single-score outputs, compared by difference

    @property
    def ok(self) -> bool:
        return self.bad_rows == 0

    def describe(self) -> str:
        measure = "largest score difference" if self.scores else "lowest cosine"
        limit = "at most" if self.scores else "at least"
        return (
            f"{self.non_finite_rows} of {self.rows} rows non-finite; {measure} "
            f"{self.worst:.5f}, {limit} {self.bound} needed"
        )


def compare_with_reference(
    got: np.ndarray, want: np.ndarray, family: str, precision: str
) -> Verdict:
    """``got`` ([rows, D]) against ``want``, the model in FP32: a row is bad where any of its
    outputs is non-finite, or its cosine is below ``REFERENCE_MIN_COSINE`` (single scores: their
    difference above ``REFERENCE_MAX_SCORE_DIFF``, relative to scores above 1)."""
    finite = np.isfinite(got).all(axis=1)
    scores = got.shape[1] == 1
    with np.errstate(all="ignore"):  # inf and NaN rows compare as bad, never raise
        if scores:
            diff = np.abs(got - want)[:, 0] / np.maximum(1.0, np.abs(want)[:, 0])
            bound = REFERENCE_MAX_SCORE_DIFF[precision]
            close = diff <= bound
            worst = float(np.nanmax(np.where(finite, diff, np.nan))) if finite.any() else np.inf
        else:
            cosine = cosine_rows(got.astype(np.float64), want.astype(np.float64))
            bound = REFERENCE_MIN_COSINE[precision][family]
            close = cosine >= bound
            worst = float(np.nanmin(np.where(finite, cosine, np.nan))) if finite.any() else np.nan
    bad = ~(finite & close)
    return Verdict(len(got), int((~finite).sum()), int(bad.sum()), worst, bound, scores)
