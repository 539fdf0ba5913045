"""Planner benchmark: plan time, plan cost and padding, fast DP beside the reference DP.

    python -m bench.planner            # the full table (a minute or two on 2 cores)
    python -m bench.planner --quick    # fewer repetitions

Every figure is measured side by side in one run; the ratios are what matter on a shared machine.
"""

from __future__ import annotations

import argparse
import bisect
import platform

import numpy as np

from builder.calibrate import median_seconds
from python_backend.common.cost_models import LinearCost, MeasuredCost
from python_backend.scheduling.planner import (
    padding_efficiency,
    per_bucket_groups,
    plan_batches,
    plan_cost,
)
from testkit.planner_reference import reference_plan

BUCKETS = (16, 32, 48, 64, 96, 128, 192, 256)
MAX_LENGTH = 512
MAX_BATCH = 256
TOKEN_BUDGET = 65536  # 256 rows at every bucket length: the largest cap the DP meets


def pad_len(n: int) -> int:
    i = bisect.bisect_left(BUCKETS, n)
    return BUCKETS[i] if i < len(BUCKETS) else n


def mergeable(n: int) -> bool:
    return n <= BUCKETS[-1]


def max_rows(padded_length: int) -> int:
    return max(1, TOKEN_BUDGET // padded_length)


def spread(name: str, num_rows: int, rng: np.random.Generator) -> list[int]:
    """Token lengths of queued rows for one traffic shape."""
    if name == "chat":  # short turns: median about 20 tokens
        raw = rng.lognormal(3.0, 0.6, num_rows)
    elif name == "documents":  # paragraphs: broad, 20 to 256
        raw = rng.uniform(20, 256, num_rows)
    elif name == "heavy-tail":  # mostly short, a tail to the max length (above the last bucket)
        raw = np.where(
            rng.random(num_rows) < 0.85,
            rng.lognormal(2.8, 0.7, num_rows),
            rng.uniform(128, MAX_LENGTH, num_rows),
        )
    else:
        raise ValueError(name)
    return np.clip(np.rint(raw), 1, MAX_LENGTH).astype(int).tolist()


def median_ms(fn, repeats: int) -> float:
    # the warm-up call fills the planner's memoised per-bucket tables
    return median_seconds(fn, repeats) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    linear = LinearCost(512)
    # a measured-style table (no closed form): exercises the planner's general path
    lengths_grid = (*BUCKETS, MAX_LENGTH)
    sizes_grid = (1, 8, 32, 128, 256)
    measured = MeasuredCost(
        lengths_grid,
        sizes_grid,
        tuple(tuple(512 + b * t * (1 + t / 1024) for b in sizes_grid) for t in lengths_grid),
        1.0,
        (1, 2, 4, 8, 16, 32, 64, 128, 256),
    )
    fast_reps, ref_reps = (15, 1) if args.quick else (51, 3)
    print(f"# python {platform.python_version()}, {platform.machine()}, numpy {np.__version__}")
    print(f"# buckets {BUCKETS}, rows above {BUCKETS[-1]} run at their exact length")
    print(f"# cap min({MAX_BATCH}, {TOKEN_BUDGET} // T) = 256 rows at every bucket\n")
    header = (
        "| cost | spread | rows | DP ms | reference ms | speed-up | DP / per-bucket cost "
        "| reference / per-bucket | padding eff. DP | padding eff. per-bucket |"
    )
    print(header)
    print("|---" * 10 + "|")
    for cost_name, cost, sizes in (
        ("linear 512", linear, (16, 64, 256, 1024, 4096)),
        ("measured", measured, (256, 1024, 4096)),
    ):
        for name in ("chat", "documents", "heavy-tail"):
            for num_rows in sizes:
                lengths = spread(name, num_rows, rng)
                plan_args = (pad_len, max_rows, MAX_BATCH, cost, mergeable)
                fast_ms = median_ms(lambda: plan_batches(lengths, *plan_args), fast_reps)  # noqa: B023
                ref_ms = median_ms(lambda: reference_plan(lengths, *plan_args), ref_reps)  # noqa: B023
                plan = plan_batches(lengths, *plan_args)
                ref = reference_plan(lengths, *plan_args)
                base = per_bucket_groups(lengths, *plan_args)
                base_cost = plan_cost(base, cost)
                print(
                    f"| {cost_name} | {name} | {num_rows} | {fast_ms:.3f} | {ref_ms:.1f} "
                    f"| {ref_ms / fast_ms:.0f}x | {plan_cost(plan, cost) / base_cost:.4f} "
                    f"| {plan_cost(ref, cost) / base_cost:.4f} "
                    f"| {padding_efficiency(lengths, plan):.3f} "
                    f"| {padding_efficiency(lengths, base):.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
