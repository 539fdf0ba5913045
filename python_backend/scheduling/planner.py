"""Which queued rows share one forward: an exact dynamic-programming partitioner.

Cost model
    A forward of B rows padded to length T costs ``cost(B, T)`` token-units (``cost_models``); the
    default is ``overhead + B*T``. Nothing here depends on the form of ``cost``: the plan is exact
    for any cost that depends only on (group size, group padded length).

What a plan may be
    Rows are sorted by padded length, longest first, stably (arrival order within a bucket). A plan
    splits that order into consecutive groups; a group runs at the padded length of its first
    (longest) row and holds at most ``cap(T) = min(max_batch, max_rows(T))`` rows. Rows that are
    not mergeable (longer than the last bucket) are never padded into another length: each exact
    length is a segment of its own, planned alone.

Recurrence (the straightforward form, kept in the tests as the reference)
    h[n] = 0;  h[i] = min_{1 <= m <= cap(P[i]), i+m <= n}  cost(m, P[i]) + h[i+m]
    where P[i] is the padded length of the i-th sorted row. That is O(n * cap) steps, too slow in
    Python for a queue of 1024 rows (about 10 ms).

The fast form used here
    The sorted rows form K runs of equal padded length (one per bucket present). Rows of one run
    are interchangeable, so from any position inside run k an optimal continuation is: some
    groups wholly inside the run (only their sizes matter), then either the run's end, or one
    group that starts in run k and crosses into later runs. With ``u`` rows of run k left:

        H_k(u) = min_{0 <= v <= min(u, cap_k - 1)}  g_k(u - v) + Y_k(v)
        Y_k(0) = h[end_k]
        Y_k(v) = min_{1 <= w <= cap_k - v}  cost(v + w, T_k) + h[end_k + w]      (v >= 1)
        g_k(r) = min_{1 <= m <= min(r, cap_k)}  cost(m, T_k) + g_k(r - m),  g_k(0) = 0

    g_k depends only on (cost, T_k, cap_k), never on the queue, so it is memoised across calls.
    A group entering run k from an earlier run ends at most ``max cap`` rows into it, so H_k is
    only needed at the first ``max cap`` positions of each run. Each run then costs two numpy
    min-reductions over at most cap x cap candidates: O(K * cap^2) vectorised work plus O(K)
    Python steps, independent of how many rows share a bucket.

Closed forms for costs affine in the group size
    When cost(m, T) = o_T + m * a_T (the linear model, and the builder's calibrated fit), g_k(r)
    is ceil(r / cap) * o + r * a, Y_k is a prefix minimum over w, and H_k splits at the one point
    where ceil((u - v) / cap) changes into a prefix and a suffix minimum over v: O(K * cap) work.
    Small runs still take the dense path (one reduction beats a dozen small numpy calls); both
    paths give the same plan, and the tests hold each against the reference.

Ties
    Equal costs go to the larger group: the memoised split of a run takes the largest first group,
    and a group crossing into later runs takes as many rows, from its own run and from later
    ones, as ties allow. With ``overhead = 0`` the plan is therefore exactly
    the per-bucket grouping (chunks of ``cap`` in arrival order).

Invariants of the result
    Every row is in exactly one group; a group's padded length is at least each member's; a group
    holds at most cap(T) rows; member indices are in arrival order; the plan is never costlier
    than ``per_bucket_groups`` (that grouping is one of the splits the DP considers).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from python_backend.common.cost_models import CostModel, LinearCost, cost_row

# (padded_length, row indices in arrival order): one forward.
Group = tuple[int, list[int]]
PadLen = Callable[[int], int]
MaxRows = Callable[[int], int]
Mergeable = Callable[[int], bool]


@dataclass(frozen=True)
class _Run:
    """Rows of one padded length, consecutive in the sorted order."""

    padded_length: int  # the bucket length every row of the run is padded to
    rows: np.ndarray  # row indices, arrival order: int64 [num_rows]
    cap: int  # most rows one forward at this length may hold (>= 1)


def _cap(padded_length: int, max_rows: MaxRows, max_batch: int) -> int:
    cap = min(int(max_batch), int(max_rows(padded_length)))
    if cap < 1:
        raise ValueError(f"no forward can hold a row at padded length {padded_length} (cap {cap})")
    return cap


def _sorted_runs(
    lengths: Sequence[int],
    pad_len: PadLen,
    max_rows: MaxRows,
    max_batch: int,
    mergeable: Mergeable | None,
) -> tuple[list[_Run], list[_Run]]:
    """(runs of rows above the last bucket, one per exact length; runs of mergeable rows).

    Both lists are longest first, rows within a run in arrival order (a stable sort). Groups may
    span the mergeable runs; each exact-length run is planned alone.
    """
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    row_lengths = np.asarray(lengths, dtype=np.int64).reshape(-1)
    if row_lengths.size == 0:
        return [], []
    if row_lengths.min() < 1:
        bad = int(np.argmin(row_lengths))
        raise ValueError(f"lengths[{bad}] = {row_lengths[bad]}: every row needs at least one token")
    # the callables are asked once per distinct length, not once per row
    distinct, inverse = np.unique(row_lengths, return_inverse=True)
    padded_of = np.array([int(pad_len(int(n))) for n in distinct], dtype=np.int64)
    short = np.flatnonzero(padded_of < distinct)
    if short.size:
        n = int(distinct[short[0]])
        raise ValueError(f"pad_len({n}) = {int(padded_of[short[0]])} is shorter than the row")
    if mergeable is None:
        merge_of = np.ones(len(distinct), dtype=bool)
    else:
        merge_of = np.array([bool(mergeable(int(n))) for n in distinct], dtype=bool)
    padded, merge = padded_of[inverse], merge_of[inverse]

    def runs_of(rows: np.ndarray, key: np.ndarray) -> list[_Run]:
        rows = rows[np.argsort(-key[rows], kind="stable")]
        out = []
        for run_rows in _split_where_changes(rows, key[rows]):
            t = int(padded[run_rows[0]])
            out.append(_Run(t, run_rows, _cap(t, max_rows, max_batch)))
        return out

    return runs_of(np.flatnonzero(~merge), row_lengths), runs_of(np.flatnonzero(merge), padded)


def _split_where_changes(rows: np.ndarray, keys: np.ndarray) -> list[np.ndarray]:
    """Splits ``rows`` (sorted by ``keys``) into runs of equal key."""
    if rows.size == 0:
        return []
    cuts = np.flatnonzero(keys[1:] != keys[:-1]) + 1
    return np.split(rows, cuts)


class _RunSplitTable:
    """Best split of r interchangeable rows at one (cost, T, cap): g(r) and its first group size."""

    def __init__(self, cost: CostModel, padded_length: int, cap: int) -> None:
        self.cap = cap
        self.costs = cost_row(cost, padded_length, cap)  # [cap + 1], index = group size
        self.best = np.zeros(1, dtype=np.float64)  # g(r), r = 0..len-1
        self.first = np.zeros(1, dtype=np.int64)  # size of the first group in g(r)'s split
        affine = getattr(cost, "affine_row", None)
        # (overhead, per-row cost) when cost(m, T) = overhead + m * per_row: enables closed forms
        self.affine: tuple[float, float] | None = (
            affine(padded_length) if affine is not None else None
        )

    def ensure(self, num_rows: int) -> None:
        """Extends g up to ``num_rows`` rows."""
        have = len(self.best)
        if num_rows < have:
            return
        cap, costs = self.cap, self.costs
        best = np.concatenate([self.best, np.zeros(num_rows + 1 - have)])
        first = np.concatenate([self.first, np.zeros(num_rows + 1 - have, dtype=np.int64)])
        if self.affine is not None:
            # overhead + m*a per group: ceil(r / cap) forwards is optimal and the largest first
            # group is min(r, cap); closed form, same ties as the loop below.
            overhead, per_row = self.affine
            sizes = np.arange(have, num_rows + 1)
            best[have:] = -(-sizes // cap) * overhead + sizes * per_row
            first[have:] = np.minimum(sizes, cap)
            self.best, self.first = best, first
            return
        for r in range(have, num_rows + 1):
            top = min(r, cap)
            # candidates by first-group size m = top .. 1, so argmin's first hit is the largest m
            totals = costs[top:0:-1] + best[r - top : r]
            k = int(np.argmin(totals))
            best[r] = totals[k]
            first[r] = top - k
        self.best, self.first = best, first

    def split(self, num_rows: int) -> list[int]:
        """Group sizes of the best split of ``num_rows`` rows, first group first."""
        self.ensure(num_rows)
        sizes = []
        while num_rows > 0:
            m = int(self.first[num_rows])
            sizes.append(m)
            num_rows -= m
        return sizes


_TABLE_CACHE: OrderedDict[tuple[object, int, int], _RunSplitTable] = OrderedDict()
_TABLE_CACHE_SIZE = 512
_TABLE_LOCK = threading.Lock()


def _split_table(cost: CostModel, padded_length: int, cap: int) -> _RunSplitTable:
    try:
        key = (cost, padded_length, cap)
        hash(key)
    except TypeError:  # an unhashable cost model is planned without memoisation
        return _RunSplitTable(cost, padded_length, cap)
    with _TABLE_LOCK:
        table = _TABLE_CACHE.get(key)
        if table is not None:
            _TABLE_CACHE.move_to_end(key)
            return table
        table = _RunSplitTable(cost, padded_length, cap)
        _TABLE_CACHE[key] = table
        if len(_TABLE_CACHE) > _TABLE_CACHE_SIZE:
            _TABLE_CACHE.popitem(last=False)
        return table


def _plan_segment(runs: list[_Run], cost: CostModel) -> list[tuple[int, int, int]]:
    """Exact DP over one segment: groups as (padded_length, start, stop) in sorted positions."""
    starts = [0]
    for run in runs:
        starts.append(starts[-1] + len(run.rows))
    num_rows = starts[-1]
    h = np.full(num_rows + 1, np.inf)  # h[p]: best cost of sorted rows p..n-1 (where needed)
    h[num_rows] = 0.0
    choice_v = np.full(num_rows, -1, dtype=np.int64)  # [position] -> rows left to a crossing group
    cross_w: list[np.ndarray] = [np.zeros(0, dtype=np.int64)] * len(runs)  # [v-1] -> rows past end
    tables = [_split_table(cost, r.padded_length, r.cap) for r in runs]
    # a group from an earlier run ends fewer than that run's cap rows into a later run
    reach = [1] + [max(r.cap for r in runs[:k]) for k in range(1, len(runs))]

    for k in range(len(runs) - 1, -1, -1):
        run, table = runs[k], tables[k]
        size, cap, start, end = len(run.rows), run.cap, starts[k], starts[k + 1]
        max_w = min(cap - 1, num_rows - end)  # rows past the run a crossing group may take
        max_v = min(size, cap - 1) if max_w >= 1 else 0  # rows of this run it may take
        y = np.full(max_v + 1, np.inf)  # y[v]: best cost from v rows before the run's end
        y[0] = h[end]
        if max_v >= 1:
            crossing_cost, cross_w[k] = _best_crossing(table, h[end + 1 : end + 1 + max_w], max_v)
            y[1:] = crossing_cost
        num_needed = min(size, reach[k])
        table.ensure(size)
        values, best_v = _best_before_crossing(table, y, size, num_needed)
        h[start : start + num_needed] = values
        choice_v[start : start + num_needed] = best_v

    groups: list[tuple[int, int, int]] = []
    pos = 0
    while pos < num_rows:
        k = bisect.bisect_right(starts, pos) - 1
        run, end = runs[k], starts[k + 1]
        v = int(choice_v[pos])
        assert v >= 0, "the DP reached a position it did not solve"
        for m in tables[k].split(end - pos - v):
            groups.append((run.padded_length, pos, pos + m))
            pos += m
        if v:
            w = int(cross_w[k][v - 1])
            groups.append((run.padded_length, pos, pos + v + w))
            pos += v + w
    return groups


# below this many candidates one dense min-reduction beats the closed forms' dozen numpy calls
_SMALL_MATRIX = 4096


def _best_crossing(
    table: _RunSplitTable, h_after: np.ndarray, max_v: int
) -> tuple[np.ndarray, np.ndarray]:
    """Y(v) for v = 1..max_v: the best crossing group holding the run's last v rows.

    ``h_after[w-1]`` is h at w rows past the run's end (w = 1..max_w). Returns (Y, best w).
    """
    max_w, cap = len(h_after), table.cap
    if table.affine is not None and max_v * max_w > _SMALL_MATRIX:
        # cost(v + w) = o + (v+w)*a: Y(v) = o + v*a + min_{w <= cap - v} (w*a + h[end + w]),
        # a prefix minimum; the last index reaching it is the largest w (ties to larger group)
        overhead, per_row = table.affine
        w = np.arange(1, max_w + 1)
        vals = w * per_row + h_after
        running = np.minimum.accumulate(vals)
        last_best = np.maximum.accumulate(np.where(vals == running, w, 0))
        v = np.arange(1, max_v + 1)
        limit = np.minimum(max_w, cap - v)  # >= 1 since v <= cap - 1
        return overhead + v * per_row + running[limit - 1], last_best[limit - 1]
    # crossing[v-1, j] = cost(v + w) + h[end + w] with w = max_w - j (largest w first, so
    # argmin's first hit gives ties to the larger group); inf where v + w > cap
    costs_desc = np.concatenate([np.full(max_v + max_w, np.inf), table.costs[::-1]])
    # costs_desc[q] = cost(cap + max_v + max_w - q): row v starts at q = cap + max_v - v
    windows = _windows(costs_desc[cap:], max_w, max_v)[::-1]
    crossing = windows + h_after[::-1]
    best_j = np.argmin(crossing, axis=1)
    return crossing[np.arange(max_v), best_j], max_w - best_j


def _best_before_crossing(
    table: _RunSplitTable, y: np.ndarray, size: int, num_needed: int
) -> tuple[np.ndarray, np.ndarray]:
    """H(u) = min_v g(u - v) + y[v] at the run's first ``num_needed`` offsets (u = size - offset).

    Returns (H, best v); ties go to the largest v (the larger crossing group).
    """
    max_v = len(y) - 1
    if table.affine is not None and num_needed * (max_v + 1) > _SMALL_MATRIX:
        # g(r) = ceil(r/cap)*o + r*a, so H(u) - u*a = min_v ceil((u-v)/cap)*o + (y[v] - v*a).
        # Over v = 0..max_v (max_v < cap) the ceiling takes one value below b = u - (q-1)*cap
        # and one less from b on: a prefix minimum and a suffix minimum (one point if u <= max_v).
        overhead, per_row = table.affine
        cap = table.cap
        v = np.arange(max_v + 1)
        y_rel = y - v * per_row
        # ties go to the larger v (the larger crossing group): the last index reaching each min
        pre = np.minimum.accumulate(y_rel)
        pre_arg = np.maximum.accumulate(np.where(y_rel == pre, v, 0))
        suf = np.minimum.accumulate(y_rel[::-1])[::-1]
        suf_next = np.concatenate([suf[1:], [np.inf]])
        suf_arg = np.minimum.accumulate(np.where(y_rel < suf_next, v, max_v)[::-1])[::-1]
        u = size - np.arange(num_needed)
        q = -(-u // cap)
        b = u - (q - 1) * cap  # 1..cap
        pre_i = np.minimum(b - 1, max_v)  # v < b: never empty, since b >= 1
        first = q * overhead + pre[pre_i]
        first_arg = pre_arg[pre_i]
        # v >= b: the suffix min over b..max_v, or the single point v = u = b when u <= max_v
        b_i = np.minimum(b, max_v)
        point = u <= max_v
        second = np.where(point, y_rel[b_i], suf[b_i])
        second_arg = np.where(point, b_i, suf_arg[b_i])
        second = np.where(b <= max_v, (q - 1) * overhead + second, np.inf)
        take_second = second <= first
        best_v = np.where(take_second, second_arg, first_arg)
        best = np.where(take_second, second, first) + u * per_row
        return best, best_v
    # totals[offset, j] = g(size - offset - v) + y[v] with v = max_v - j (largest v first, so
    # argmin's first hit gives ties to the larger crossing group); g read through a window over
    # g reversed, with inf where fewer than v rows are left
    g_rev = np.concatenate([table.best[size::-1], np.full(max_v, np.inf)])
    totals = _windows(g_rev, max_v + 1, num_needed)[:, ::-1] + y[::-1]
    best_j = np.argmin(totals, axis=1)
    return totals[np.arange(num_needed), best_j], max_v - best_j


def _windows(values: np.ndarray, width: int, count: int) -> np.ndarray:
    """Read-only view ``out[i, j] = values[i + j]``, shape [count, width] (a Hankel matrix)."""
    assert values.ndim == 1 and values.flags.c_contiguous and count + width - 1 <= len(values)
    step = values.strides[0]
    return np.ndarray((count, width), values.dtype, buffer=values, strides=(step, step))


def _groups_from_positions(runs: list[_Run], spans: list[tuple[int, int, int]]) -> list[Group]:
    order = np.concatenate([run.rows for run in runs])
    return [(t, np.sort(order[a:b]).tolist()) for t, a, b in spans]


def plan_batches(
    lengths: Sequence[int],
    pad_len: PadLen,
    max_rows: MaxRows,
    max_batch: int,
    cost: CostModel | None = None,
    mergeable: Mergeable | None = None,
) -> list[Group]:
    """The cheapest split of the queued rows into forwards (see the module docstring).

    ``lengths``: tokens per queued row, arrival order. ``pad_len(n)``: the length a row of n
    tokens runs at. ``max_rows(T)``: rows the engine takes at padded length T. ``max_batch``: the
    server's own cap. ``cost``: default ``LinearCost()``. ``mergeable(n)``: False for rows that
    must run at their exact length (above the last bucket). Returns ``[(T, [row indices])]``.
    """
    cost = LinearCost() if cost is None else cost
    exact_runs, merge_runs = _sorted_runs(lengths, pad_len, max_rows, max_batch, mergeable)
    groups: list[Group] = []
    for run in exact_runs:  # one length each: no group can cross, the memoised split is the plan
        rows, pos = run.rows.tolist(), 0
        for m in _split_table(cost, run.padded_length, run.cap).split(len(rows)):
            groups.append((run.padded_length, rows[pos : pos + m]))
            pos += m
    if merge_runs:
        groups.extend(_groups_from_positions(merge_runs, _plan_segment(merge_runs, cost)))
    return groups


def per_bucket_groups(
    lengths: Sequence[int],
    pad_len: PadLen,
    max_rows: MaxRows,
    max_batch: int,
    cost: CostModel | None = None,
    mergeable: Mergeable | None = None,
) -> list[Group]:
    """Rows grouped by padded length, chunked to the cap in arrival order: the baseline.

    Same signature as ``plan_batches``; ``cost`` is accepted and unused.
    """
    exact_runs, merge_runs = _sorted_runs(lengths, pad_len, max_rows, max_batch, mergeable)
    groups: list[Group] = []
    for run in exact_runs + merge_runs:
        for a in range(0, len(run.rows), run.cap):
            groups.append((run.padded_length, run.rows[a : a + run.cap].tolist()))
    return groups


def plan_cost(groups: Sequence[Group], cost: CostModel | None = None) -> float:
    """Total cost of a plan in token-units."""
    cost = LinearCost() if cost is None else cost
    return float(sum(cost.cost(len(rows), t) for t, rows in groups))


def padding_efficiency(lengths: Sequence[int], groups: Sequence[Group]) -> float:
    """Real tokens over padded tokens computed by a plan (1.0 means no padding)."""
    padded = sum(t * len(rows) for t, rows in groups)
    return float(sum(lengths)) / padded if padded else 1.0


class PlanLayout(Protocol):
    """What a planner needs of the engine and the server: one object, not four arguments.
    ``engines.base.BucketLayout`` is the one the server uses."""

    max_batch: int  # the server's cap on rows per forward

    def pad_len(self, num_tokens: int) -> int: ...  # the length a row of n tokens runs at

    def max_rows(self, padded_length: int) -> int: ...  # rows the engine takes at that length

    def mergeable(self, num_tokens: int) -> bool: ...  # False: runs at its exact length only


# A planner: which rows share each forward. Siblings share this signature and the cost model;
# ``PLANNERS`` names them for the configuration.
Planner = Callable[[Sequence[int], PlanLayout, CostModel], list[Group]]


def plan_dp(lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> list[Group]:
    """The exact DP partitioner (``plan_batches``)."""
    return plan_batches(
        lengths, layout.pad_len, layout.max_rows, layout.max_batch, cost, layout.mergeable
    )


def plan_per_bucket(lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> list[Group]:
    """The baseline: rows grouped by bucket alone (``per_bucket_groups``)."""
    return per_bucket_groups(
        lengths, layout.pad_len, layout.max_rows, layout.max_batch, cost, layout.mergeable
    )


PLANNERS: dict[str, Planner] = {"dp": plan_dp, "per_bucket": plan_per_bucket}


def per_bucket_cost(lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> float:
    """What grouping by bucket alone would cost, from counts alone (no groups are built): the
    baseline a plan's gain is reported against. Equals ``plan_cost`` of ``plan_per_bucket``."""
    counts = Counter(layout.pad_len(n) for n in lengths)
    total = 0.0
    for padded_length, num_rows in counts.items():
        cap = _cap(padded_length, layout.max_rows, layout.max_batch)
        full, rest = divmod(num_rows, cap)
        total += full * cost.cost(cap, padded_length)
        if rest:
            total += cost.cost(rest, padded_length)
    return total
