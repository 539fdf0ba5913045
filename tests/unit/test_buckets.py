from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from builder.buckets import (
    bucket_rows,
    choose_buckets,
    padded_tokens,
    padding_efficiency,
    power_of_two_buckets,
)


def brute_force_padded(lengths, num_buckets, max_length, align=1):
    clipped = [min(n, max_length) for n in lengths]
    candidates = sorted({min(-(-n // align) * align, max_length) for n in clipped} | {max_length})
    best = None
    for k in range(1, num_buckets + 1):
        for combo in itertools.combinations(candidates[:-1], k - 1):
            cost = padded_tokens(clipped, [*combo, max_length])
            best = cost if best is None else min(best, cost)
    return best


@given(
    st.lists(st.integers(1, 60), min_size=1, max_size=14),
    st.integers(1, 5),
    st.sampled_from([40, 64]),
    st.sampled_from([1, 8]),
)
def test_bucket_choice_agrees_with_brute_force(lengths, num_buckets, max_length, align):
    chosen = choose_buckets(lengths, num_buckets, max_length, align)
    assert chosen[-1] == max_length and len(chosen) <= num_buckets
    assert chosen == sorted(set(chosen))
    clipped = [min(n, max_length) for n in lengths]
    assert padded_tokens(clipped, chosen) == brute_force_padded(
        lengths, num_buckets, max_length, align
    )


def test_chosen_buckets_pad_less_than_powers_of_two_on_skewed_lengths():
    lengths = [5] * 50 + [20] * 30 + [100] * 15 + [250] * 5
    chosen = choose_buckets(lengths, 4, 256)
    assert padding_efficiency(lengths, chosen) > padding_efficiency(
        lengths, power_of_two_buckets(256)
    )


def test_bucket_rows_fit_the_token_budget_and_capture_powers_of_two():
    rows = bucket_rows([16, 100, 256], token_budget=4096, max_batch=64)
    assert [(b.length, b.max_rows) for b in rows] == [(16, 64), (100, 40), (256, 16)]
    assert rows[1].captured_batch_sizes == (1, 2, 4, 8, 16, 32, 40)
    assert all(b.max_rows * b.length <= 4096 for b in rows)


def test_no_captured_sizes_for_an_engine_that_runs_any_shape():
    rows = bucket_rows([16, 100], token_budget=4096, max_batch=64, capture=False)
    assert [(b.length, b.max_rows, b.captured_batch_sizes) for b in rows] == [
        (16, 64, ()),
        (100, 40, ()),
    ]
