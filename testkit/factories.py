"""Factories for planner inputs: bucket layouts, engine caps and row lengths."""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st


@dataclass(frozen=True)
class Buckets:
    """Bucket lengths (ascending) and the engine's token budget per forward."""

    lengths: tuple[int, ...]
    token_budget: int

    def pad_len(self, n: int) -> int:
        i = bisect.bisect_left(self.lengths, n)
        return self.lengths[i] if i < len(self.lengths) else n

    def mergeable(self, n: int) -> bool:
        return n <= self.lengths[-1]

    def max_rows(self, padded_length: int) -> int:
        """Rows x length within the token budget: never grows with the length."""
        return max(1, self.token_budget // padded_length)

    def constant_rows(self, rows: int) -> Callable[[int], int]:
        return lambda _t: rows


def buckets_strategy(max_len: int = 300) -> st.SearchStrategy[Buckets]:
    return st.builds(
        lambda ls, budget: Buckets(tuple(sorted(set(ls))), budget),
        st.lists(st.integers(1, max_len), min_size=1, max_size=8),
        st.integers(1, 4096),
    )


def lengths_strategy(max_len: int = 400, max_rows: int = 80) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max_len), max_size=max_rows)
