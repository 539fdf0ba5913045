"""Each profile's opt batch is the batch the planner runs there, on queues drawn from a sample."""

from __future__ import annotations

from builder.opt_shapes import planned_opt_rows, weighted_median
from python_backend.common.cost_models import LinearCost
from python_backend.common.manifest import Bucket, LongRows
from python_backend.engines.base import BucketLayout

CAPTURED = (1, 2, 4, 8, 16, 32, 64)


def layout(long_rows: bool = False) -> BucketLayout:
    buckets = (Bucket(16, 64, 32, CAPTURED), Bucket(64, 64, 32, CAPTURED))
    return BucketLayout(buckets, 128, 64, LongRows(16, 96) if long_rows else None)


def test_the_median_is_taken_over_rows_not_groups():
    assert weighted_median([1, 9]) == 9  # nine of ten rows run in the group of nine
    assert weighted_median([5, 5, 1]) == 5
    assert weighted_median([3]) == 3


def test_a_full_queue_of_one_bucket_tunes_for_the_batch_that_really_runs():
    # 100 rows of one bucket: groups of 64 and 36 (no overhead: per-bucket grouping); the middle
    # row runs in the 64-row group
    opt = planned_opt_rows([16] * 10, layout(), LinearCost(0.0), queued_rows=100)
    assert [b.opt_rows for b in opt.buckets] == [64, 1]  # no row reached the 64 bucket
    # 40 queued rows run as one group of 40, padded to the captured 64
    opt = planned_opt_rows([10], layout(), LinearCost(0.0), queued_rows=40)
    assert opt.buckets[0].opt_rows == 64
    opt = planned_opt_rows([10], layout(), LinearCost(0.0), queued_rows=8)
    assert opt.buckets[0].opt_rows == 8
    assert opt.source["queued_rows"] == 8 and "simulated" in opt.source["method"]


def test_the_overhead_decides_how_the_planner_groups_and_so_the_opt_batch():
    # one long row per four short ones: with no overhead each bucket runs alone; with a large
    # overhead the short rows ride along with the long ones at 64
    sample = [10, 10, 10, 10, 60]
    alone = planned_opt_rows(sample, layout(), LinearCost(0.0), queued_rows=20)
    merged = planned_opt_rows(sample, layout(), LinearCost(4096.0), queued_rows=20)
    assert alone.buckets[0].opt_rows > 1
    assert merged.buckets[1].opt_rows == 32 and merged.buckets[0].opt_rows == 1


def test_long_rows_tune_for_their_exact_length_groups_and_no_sample_keeps_half():
    opt = planned_opt_rows([100], layout(long_rows=True), LinearCost(512.0), queued_rows=12)
    assert opt.long_rows is not None and opt.long_rows.opt_rows == 12
    assert all(1 <= b.opt_rows <= b.max_rows for b in opt.buckets)
    none = planned_opt_rows(None, layout(), LinearCost(512.0), queued_rows=64)
    assert [b.opt_rows for b in none.buckets] == [32, 32] and "no length sample" in str(none.source)
