"""The straightforward planner DP, kept as the reference the fast planner must agree with."""

from __future__ import annotations

from collections.abc import Sequence

from python_backend.common.cost_models import CostModel, LinearCost
from python_backend.scheduling.planner import Group, MaxRows, Mergeable, PadLen


def reference_plan(
    lengths: Sequence[int],
    pad_len: PadLen,
    max_rows: MaxRows,
    max_batch: int,
    cost: CostModel | None = None,
    mergeable: Mergeable | None = None,
) -> list[Group]:
    """h[i] = min_m cost(m, P[i]) + h[i+m] over the sorted rows, one segment at a time."""
    cost = LinearCost() if cost is None else cost
    merge = [i for i, n in enumerate(lengths) if mergeable is None or mergeable(n)]
    exact: dict[int, list[int]] = {}
    for i, n in enumerate(lengths):
        if mergeable is not None and not mergeable(n):
            exact.setdefault(n, []).append(i)
    segments = [exact[n] for n in sorted(exact, reverse=True)]
    segments.append(sorted(merge, key=lambda i: -pad_len(lengths[i])))
    groups: list[Group] = []
    for order in segments:
        padded = [pad_len(lengths[i]) for i in order]
        n = len(order)
        h = [0.0] * (n + 1)
        take = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            cap = min(max_batch, max_rows(padded[i]))
            best, best_m = float("inf"), 0
            for m in range(min(cap, n - i), 0, -1):  # largest first: ties go to the larger group
                c = cost.cost(m, padded[i]) + h[i + m]
                if c < best:
                    best, best_m = c, m
            h[i], take[i] = best, best_m
        i = 0
        while i < n:
            m = take[i]
            groups.append((padded[i], sorted(order[i : i + m])))
            i += m
    return groups
