"""Each TensorRT profile's opt batch: the rows per forward the planner really runs there.

TensorRT tunes a profile's kernels for its opt shape. Served forwards rarely hold half a
bucket's max rows (the old choice): the planner splits a queue into many small groups at the
short buckets and few at the long ones, and that split depends on the traffic and the cost. So
the opt batch is simulated on the build's length sample, with the server's own planner:

    draw ``num_collections`` queues of ``queued_rows`` rows (``--opt-queued-rows``) from the sample (fixed seed); plan
    each with ``plan_dp`` under the bucket layout and the build's cost model; a profile's opt
    batch is the group size its typical row runs in (the row-weighted median of its groups'
    sizes), rounded up to the batch that really runs (the next captured size).

A profile no simulated row reached keeps 1 (the smallest shape is then the likeliest). Without a
length sample, half the max rows, as before. The choice and how it was made go into the manifest
(``opt_rows_source``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from python_backend.common.cost_models import CostModel
from python_backend.common.manifest import Bucket, LongRows
from python_backend.engines.base import BucketLayout
from python_backend.scheduling.planner import plan_dp

NUM_COLLECTIONS = 50


@dataclass(frozen=True)
class OptChoice:
    buckets: tuple[Bucket, ...]  # with opt_rows set
    long_rows: LongRows | None  # with opt_rows set
    source: dict[str, Any] = field(default_factory=dict)  # how, for the manifest


def weighted_median(sizes: Sequence[int]) -> int:
    """The group size the middle row runs in: each group counts once per row it holds."""
    per_row = np.repeat(np.asarray(sizes), np.asarray(sizes))
    return int(np.sort(per_row)[(len(per_row) - 1) // 2])


def planned_opt_rows(
    sample: Sequence[int] | None,
    layout: BucketLayout,
    cost: CostModel,
    queued_rows: int,
    num_collections: int = NUM_COLLECTIONS,
    seed: int = 0,
) -> OptChoice:
    """The layout's buckets and long-row profile with the opt batch the planner runs (above)."""
    buckets, long_rows = layout.buckets, layout.long_rows
    if not sample:  # the buckets as sized (builder.buckets.bucket_rows: half the max rows)
        return OptChoice(buckets, long_rows, {"method": "half of max rows (no length sample)"})
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.asarray(sample, dtype=np.int64), layout.longest_row)
    sizes: defaultdict[int | None, list[int]] = defaultdict(list)  # bucket length -> group sizes
    for _ in range(num_collections):
        queue = rng.choice(lengths, size=queued_rows).tolist()
        for padded_length, rows in plan_dp(queue, layout, cost):
            key = padded_length if layout.bucket_index(padded_length) is not None else None
            sizes[key].append(len(rows))

    def opt(length: int, max_rows: int, groups: list[int]) -> int:
        if not groups:
            return 1
        return min(max_rows, layout.run_batch_size(length, weighted_median(groups)))

    chosen = tuple(
        replace(b, opt_rows=opt(b.length, b.max_rows, sizes.get(b.length, []))) for b in buckets
    )
    if long_rows is not None:
        long_groups = sizes.get(None, [])
        long_opt = min(long_rows.max_rows, weighted_median(long_groups)) if long_groups else 1
        long_rows = replace(long_rows, opt_rows=long_opt)
    source = {
        "method": "simulated: the planner on queues drawn from the length sample",
        "queued_rows": queued_rows,
        "collections": num_collections,
        "sample_rows": len(sample),
        "cost": repr(cost),
    }
    return OptChoice(chosen, long_rows, source)
