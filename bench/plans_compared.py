"""How often the DP plan differs from per-bucket grouping on the serving benchmark's own rows.

    python -m bench.plans_compared [--repository build/bench-repository] [--trials 200]

Random collections of the benchmark's request rows (bench/data/perf_input.json), planned with
the bench model's calibrated cost; for each collection size: the share of collections whose DP
plan differs from the per-bucket grouping, and the DP's cost over the per-bucket cost under the
calibrated fit and under the measured table it was fitted to.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from bench.harness import request_rows
from bench.paths import ROOT
from python_backend.cost_models import cost_model_from_dict
from python_backend.engines.base import BucketLayout
from python_backend.manifest import load_manifest
from python_backend.planner import PLANNERS, plan_cost


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=ROOT / "build" / "bench-repository")
    parser.add_argument("--trials", type=int, default=200)
    args = parser.parse_args()
    version = args.repository / "planner_dp" / "1"
    if not (version / "manifest.json").is_file():
        sys.exit(f"no bench model at {version}: run python -m bench.serving (make bench) first")
    manifest = load_manifest(version)
    layout = BucketLayout.from_manifest(manifest)
    fit, table = manifest.planner_cost(), cost_model_from_dict(manifest.calibration["table"])
    lengths = [len(r) for r in request_rows(version)]
    rng = np.random.default_rng(0)
    print(
        "| rows per collection | plans that differ | DP / per-bucket (fit) | DP / per-bucket (table) |"
    )
    print("|---|---|---|---|")
    for size in (8, 16, 32, 64):
        differ, costs = 0, np.zeros((2, 2))
        for _ in range(args.trials):
            sample = [lengths[i] for i in rng.choice(len(lengths), size)]
            dp = PLANNERS["dp"](sample, layout, fit)
            base = PLANNERS["per_bucket"](sample, layout, fit)
            differ += sorted((t, tuple(r)) for t, r in dp) != sorted((t, tuple(r)) for t, r in base)
            for k, cost in enumerate((fit, table)):
                costs[k] += (plan_cost(dp, cost), plan_cost(base, cost))
        print(
            f"| {size} | {differ / args.trials:.0%} | {costs[0, 0] / costs[0, 1]:.4f} "
            f"| {costs[1, 0] / costs[1, 1]:.4f} |"
        )


if __name__ == "__main__":
    main()
