"""BucketLayout: the lookups the planner, the scheduler and the TensorRT engine share."""

from __future__ import annotations

import pytest

from python_backend.common.manifest import Bucket, LongRows
from python_backend.engines.base import BucketLayout


def layout() -> BucketLayout:
    buckets = (Bucket(16, 64, 32, (1, 2, 4, 8, 64)), Bucket(128, 8, 4, ()))
    return BucketLayout(buckets, max_length=200, max_batch=64, long_rows=LongRows(4, 160))


def test_rows_pad_to_their_bucket_and_run_exact_above_the_last():
    lay = layout()
    assert [lay.pad_len(n) for n in (1, 16, 17, 128, 129, 200)] == [16, 16, 128, 128, 129, 200]
    assert lay.mergeable(128) and not lay.mergeable(129)
    assert lay.longest_row == 200


def test_bucket_index_matches_exact_bucket_lengths_only():
    lay = layout()
    assert [lay.bucket_index(t) for t in (16, 128, 15, 17, 150)] == [0, 1, None, None, None]


def test_a_batch_runs_at_the_next_captured_size():
    lay = layout()
    assert [lay.run_batch_size(16, b) for b in (1, 3, 5, 9, 64)] == [1, 4, 8, 64, 64]
    assert lay.run_batch_size(128, 3) == 3  # nothing captured: runs as it is
    assert lay.run_batch_size(150, 3) == 3  # the long-row profile runs as it is


def test_max_rows_per_profile_and_no_profile_past_the_max_length():
    lay = layout()
    assert (lay.max_rows(16), lay.max_rows(128), lay.max_rows(150)) == (64, 8, 4)
    with pytest.raises(ValueError, match="no engine profile takes rows of 201 tokens"):
        lay.max_rows(201)


def test_a_servers_cap_bounds_every_profiles_rows_and_never_raises_one():
    capped = layout().capped(6)
    assert capped.max_batch == 6
    assert (capped.max_rows(16), capped.max_rows(128), capped.max_rows(150)) == (6, 6, 4)
    assert layout().capped(100).max_batch == 64
