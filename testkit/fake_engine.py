"""A fake engine for scheduler tests: no model, an output that identifies each row.

Its output for a row is (sum of real token ids, number of real tokens, padded length), so a test
can tell that every row got its own answer and at which length it ran. Never served. A real
manifest for it (``manifest_for``) lets the Triton glue be tested as it reads a built one.
"""

from __future__ import annotations

import threading

import numpy as np

from python_backend.common.cost_models import LinearCost
from python_backend.common.manifest import Bucket, LongRows, Manifest
from python_backend.engines.base import BucketLayout


def layout(lengths=(16, 32, 64), max_rows=8, max_length=None, long_rows_max=4) -> BucketLayout:
    buckets = tuple(Bucket(t, max_rows, max(1, max_rows // 2)) for t in lengths)
    max_length = max_length or lengths[-1]
    long_rows = LongRows(long_rows_max, max_length) if max_length > lengths[-1] else None
    return BucketLayout(buckets, max_length, max_batch=max_rows, long_rows=long_rows)


def manifest_for(layout: BucketLayout, **changes) -> Manifest:
    """A real manifest for an engine of this layout (the embedding family, 30522 ids, a cost of
    64 tokens per forward); ``changes`` replace fields."""
    fields = dict(
        model_name="m",
        family="embedding",
        output_name=FakeChecksumEngine.output_name,
        output_dim=FakeChecksumEngine.output_dim,
        tokenizer_file="tokenizer.json",
        max_length=layout.max_length,
        vocab_size=30522,
        pad_token_id=0,
        buckets=layout.buckets,
        max_batch=layout.max_batch,
        engine_kind="onnxruntime",
        engine_files=("model.onnx",),
        precision="fp32",
        cost_model=LinearCost(64),
        long_rows=layout.long_rows,
    )
    return Manifest(**{**fields, **changes})


class FakeChecksumEngine:
    output_name = "EMBEDDING"
    output_dim = 3

    def __init__(self, layout: BucketLayout, fail=None, gate: threading.Event | None = None):
        self.layout = layout
        self.fail = fail  # callable(ids, mask) -> Exception | None
        self.gate = gate  # when set, forwards wait for it (to pile up a queue)
        self.calls: list[tuple[int, int]] = []  # (rows, padded length) of each forward tried
        self._called = threading.Condition()

    def wait_for_calls(self, count: int, timeout_s: float = 5.0) -> bool:
        """Waits until ``count`` forwards have started (tests synchronise on this, never sleep)."""
        with self._called:
            return self._called.wait_for(lambda: len(self.calls) >= count, timeout_s)

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        with self._called:
            rows, length = input_ids.shape
            self.calls.append((rows, length))
            self._called.notify_all()
        if self.gate is not None:
            self.gate.wait(10)
        if self.fail is not None:
            error = self.fail(input_ids, attention_mask)
            if error is not None:
                raise error
        real = attention_mask == 1
        return np.stack(
            [
                (input_ids * real).sum(axis=1),
                real.sum(axis=1),
                np.full(len(input_ids), input_ids.shape[1]),
            ],
            axis=1,
        ).astype(np.float32)

    def close(self) -> None:
        pass


def expected(row: np.ndarray) -> tuple[float, float]:
    return float(row.sum()), float(len(row))
