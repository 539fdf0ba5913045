"""Bucket lengths chosen from a sample of row lengths, and each bucket's batch range.

Choosing k buckets is an exact DP over the sorted distinct lengths v_1 < ... < v_m (counts c_i):
a bucket at v_j serves every row in (v_prev, v_j] and costs v_j per row, so

    best[b][j] = min_{i < j} best[b-1][i] + v_j * (C_j - C_i),   C = prefix sums of counts

with the last bucket fixed at the max length (every row must fit). O(k * m^2), m <= max length;
vectorised over i. Candidate lengths may be rounded up to a multiple (tensor-core friendly).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from python_backend.common.manifest import Bucket


def padded_tokens(lengths: Sequence[int], buckets: Sequence[int]) -> int:
    """Tokens computed when every row runs at its bucket (rows above the last run as they are)."""
    arr = np.asarray(lengths, dtype=np.int64)
    edges = np.asarray(sorted(buckets), dtype=np.int64)
    idx = np.searchsorted(edges, arr, side="left")
    padded = np.where(idx < len(edges), edges[np.minimum(idx, len(edges) - 1)], arr)
    return int(padded.sum())


def padding_efficiency(lengths: Sequence[int], buckets: Sequence[int]) -> float:
    """Real tokens over padded tokens under these buckets."""
    total = padded_tokens(lengths, buckets)
    return float(np.sum(lengths)) / total if total else 1.0


def power_of_two_buckets(max_length: int, smallest: int = 16) -> list[int]:
    out, b = [], smallest
    while b < max_length:
        out.append(b)
        b *= 2
    return [*out, max_length]


def choose_buckets(
    lengths: Sequence[int], num_buckets: int, max_length: int, align: int = 1
) -> list[int]:
    """The ``num_buckets`` lengths (last = ``max_length``) minimising expected padded tokens."""
    if num_buckets < 1:
        raise ValueError(f"--num-buckets must be >= 1, got {num_buckets}")
    if align < 1:
        raise ValueError(f"--align must be >= 1, got {align}")
    arr = np.clip(np.asarray(lengths, dtype=np.int64), 1, max_length)
    if arr.size == 0:
        raise ValueError("the length sample is empty")
    rounded = np.minimum(-(-arr // align) * align, max_length)
    values, counts = np.unique(rounded, return_counts=True)
    if values[-1] != max_length:
        values = np.append(values, max_length)
        counts = np.append(counts, 0)
    m = len(values)
    k = min(num_buckets, m)
    prefix = np.concatenate([[0], np.cumsum(counts)])  # prefix[j] = rows with value < values[j]
    # cover[b][j]: cheapest cover of values[:j] by b buckets, the last one at values[j-1]
    cover = np.full((k + 1, m + 1), np.inf)
    parent = np.zeros((k + 1, m + 1), dtype=np.int64)
    cover[1, 1:] = values * prefix[1:]
    for b in range(2, k + 1):
        for j in range(b, m + 1):
            i = np.arange(b - 1, j)  # the previous bucket closes at values[i-1]
            cand = cover[b - 1, i] + values[j - 1] * (prefix[j] - prefix[i])
            a = int(np.argmin(cand))
            cover[b, j], parent[b, j] = cand[a], i[a]
    b = int(np.argmin(cover[1:, m])) + 1  # fewest buckets among the cheapest
    chosen, j = [], m
    while b >= 1:
        chosen.append(int(values[j - 1]))
        j, b = int(parent[b, j]), b - 1
    return sorted(chosen)


def bucket_rows(
    lengths: Sequence[int],
    token_budget: int,
    max_batch: int,
    batch_multiple: int = 1,
    capture: bool = True,
) -> list[Bucket]:
    """Per bucket: max rows (rows x length <= budget, <= max batch), opt rows, captured sizes.

    ``capture``: powers of two up to max rows, for an engine that replays CUDA graphs; none for
    one that runs every shape as it is (ONNX Runtime).
    """
    if token_budget < 1 or max_batch < 1:
        raise ValueError("--token-budget and --max-batch must be >= 1")
    out = []
    for length in sorted(lengths):
        max_rows = max(1, min(max_batch, token_budget // length))
        if batch_multiple > 1 and max_rows > batch_multiple:
            max_rows -= max_rows % batch_multiple
        captured = [1]
        while captured[-1] * 2 < max_rows:
            captured.append(captured[-1] * 2)
        if captured[-1] != max_rows:
            captured.append(max_rows)
        opt = max(1, max_rows // 2)
        out.append(Bucket(length, max_rows, opt, tuple(captured) if capture else ()))
    return out
