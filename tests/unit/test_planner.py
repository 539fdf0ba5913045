from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from python_backend.common.cost_models import LinearCost, MeasuredCost
from python_backend.scheduling.planner import (
    PLANNERS,
    padding_efficiency,
    per_bucket_cost,
    per_bucket_groups,
    plan_batches,
    plan_cost,
)
from testkit.factories import Buckets, buckets_strategy, lengths_strategy
from testkit.planner_reference import reference_plan


@dataclass(frozen=True)
class GenericLinearCost:
    """``overhead + B*T`` without the closed-form hook: drives the planner's general path."""

    overhead_tokens: float

    def cost(self, num_rows: int, padded_length: int) -> float:
        return self.overhead_tokens + num_rows * padded_length


def measured_cost_strategy() -> st.SearchStrategy[MeasuredCost]:
    """Tables with steps (captured batch sizes) and superlinear growth in T."""

    def build(base: float, per_token: float, attn: float, captured: bool) -> MeasuredCost:
        lengths = (16, 64, 256)
        sizes = (1, 4, 16, 64)
        times = tuple(
            tuple(base + per_token * b * t + attn * b * t * t / 256 for b in sizes) for t in lengths
        )
        return MeasuredCost(
            lengths, sizes, times, per_token, (1, 2, 4, 8, 16, 32) if captured else ()
        )

    return st.builds(
        build,
        st.floats(1.0, 5000.0),
        st.floats(0.1, 2.0),
        st.floats(0.0, 1.0),
        st.booleans(),
    )


cost_strategy = st.one_of(
    st.builds(LinearCost, st.sampled_from([0.0, 1.0, 7.0, 48.0, 512.0, 4000.0])),
    st.builds(GenericLinearCost, st.sampled_from([0.0, 3.0, 48.0, 512.0])),
    measured_cost_strategy(),
)


def plan_inputs(b: Buckets, max_batch: int):
    return dict(pad_len=b.pad_len, max_rows=b.max_rows, max_batch=max_batch, mergeable=b.mergeable)


def assert_valid_plan(lengths, groups, b: Buckets, max_batch: int) -> None:
    seen = sorted(i for _, rows in groups for i in rows)
    assert seen == list(range(len(lengths))), "every row is in exactly one group"
    for padded, rows in groups:
        assert rows == sorted(rows), "members are listed in arrival order"
        assert 1 <= len(rows) <= min(max_batch, b.max_rows(padded))
        for i in rows:
            assert padded >= b.pad_len(lengths[i])
            if not b.mergeable(lengths[i]):
                assert padded == lengths[i], "a row above the last bucket runs at its own length"
                assert all(lengths[j] == lengths[i] for j in rows)


def assert_consecutive_in_sorted_order(lengths, groups, b: Buckets) -> None:
    """Each group is a block of the stable longest-first order, led by its longest row."""
    merge = [i for i in range(len(lengths)) if b.mergeable(lengths[i])]
    order = sorted(merge, key=lambda i: -b.pad_len(lengths[i]))
    position = {i: p for p, i in enumerate(order)}
    for padded, rows in groups:
        if not b.mergeable(lengths[rows[0]]):
            continue
        spots = sorted(position[i] for i in rows)
        assert spots == list(range(spots[0], spots[0] + len(rows)))
        assert padded == b.pad_len(lengths[order[spots[0]]])


@given(buckets_strategy(), lengths_strategy(), st.integers(1, 64), cost_strategy)
def test_plan_holds_every_row_once_within_caps_and_padding(b, lengths, max_batch, cost):
    groups = plan_batches(lengths, cost=cost, **plan_inputs(b, max_batch))
    assert_valid_plan(lengths, groups, b, max_batch)
    assert_consecutive_in_sorted_order(lengths, groups, b)


@given(buckets_strategy(), lengths_strategy(), st.integers(1, 64), cost_strategy)
def test_plan_is_never_costlier_than_per_bucket_grouping(b, lengths, max_batch, cost):
    args = plan_inputs(b, max_batch)
    planned = plan_cost(plan_batches(lengths, cost=cost, **args), cost)
    baseline = per_bucket_groups(lengths, **args)
    assert_valid_plan(lengths, baseline, b, max_batch)
    assert planned <= plan_cost(baseline, cost) * (1 + 1e-12)


@dataclass(frozen=True)
class Layout:
    """A ``PlanLayout`` over the test buckets: the one-object form the registry's planners take."""

    b: Buckets
    max_batch: int

    def pad_len(self, n: int) -> int:
        return self.b.pad_len(n)

    def max_rows(self, padded_length: int) -> int:
        return self.b.max_rows(padded_length)

    def mergeable(self, n: int) -> bool:
        return self.b.mergeable(n)


@given(buckets_strategy(), lengths_strategy(), st.integers(1, 64), cost_strategy)
def test_the_registry_planners_are_the_public_functions_over_one_layout(
    b, lengths, max_batch, cost
):
    layout, args = Layout(b, max_batch), plan_inputs(b, max_batch)
    assert PLANNERS["dp"](lengths, layout, cost) == plan_batches(lengths, cost=cost, **args)
    assert PLANNERS["per_bucket"](lengths, layout, cost) == per_bucket_groups(lengths, **args)


@given(buckets_strategy(), lengths_strategy(), st.integers(1, 64), cost_strategy)
def test_the_per_bucket_cost_from_counts_equals_the_cost_of_its_groups(b, lengths, max_batch, cost):
    grouped = plan_cost(per_bucket_groups(lengths, cost=cost, **plan_inputs(b, max_batch)), cost)
    assert math.isclose(per_bucket_cost(lengths, Layout(b, max_batch), cost), grouped, rel_tol=1e-9)


@given(buckets_strategy(), lengths_strategy(), st.integers(1, 64))
def test_zero_overhead_gives_exactly_the_per_bucket_grouping(b, lengths, max_batch):
    args = plan_inputs(b, max_batch)
    assert plan_batches(lengths, cost=LinearCost(0), **args) == per_bucket_groups(lengths, **args)


@given(
    buckets_strategy(max_len=600), lengths_strategy(max_rows=120), st.integers(1, 64), cost_strategy
)
def test_fast_dp_agrees_with_reference_dp(b, lengths, max_batch, cost):
    args = plan_inputs(b, max_batch)
    fast = plan_batches(lengths, cost=cost, **args)
    reference = reference_plan(lengths, cost=cost, **args)
    assert plan_cost(fast, cost) == pytest.approx(plan_cost(reference, cost), rel=1e-9, abs=1e-9)


# a quarter of the profile's examples: each runs the quadratic reference on hundreds of rows; the
# test above checks the same property with every example, on queues of up to 120 rows
@settings(max_examples=max(20, settings.default.max_examples // 4))
@given(
    buckets_strategy(),
    st.lists(st.integers(1, 64), min_size=150, max_size=300),
    st.sampled_from([1, 2, 7, 64, 256]),
    cost_strategy,
)
def test_fast_dp_agrees_with_reference_dp_on_long_queues(b, lengths, max_batch, cost):
    args = plan_inputs(b, max_batch) | {"max_rows": b.constant_rows(256)}
    fast = plan_batches(lengths, cost=cost, **args)
    reference = reference_plan(lengths, cost=cost, **args)
    assert plan_cost(fast, cost) == pytest.approx(plan_cost(reference, cost), rel=1e-9, abs=1e-9)


def set_partitions(items):
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in set_partitions(rest):
        yield [[first], *partition]
        for k in range(len(partition)):
            yield [*partition[:k], [first, *partition[k]], *partition[k + 1 :]]


def brute_force_cost(lengths, b: Buckets, max_batch: int, cost) -> float:
    """The cheapest of all set partitions, with no ordering assumption at all."""
    best = math.inf
    for partition in set_partitions(list(range(len(lengths)))):
        total = 0.0
        for group in partition:
            exact = {lengths[i] for i in group if not b.mergeable(lengths[i])}
            if exact and (len(exact) > 1 or any(b.mergeable(lengths[i]) for i in group)):
                break  # rows above the last bucket only share a forward with their own length
            padded = max(b.pad_len(lengths[i]) for i in group)
            if len(group) > min(max_batch, b.max_rows(padded)):
                break
            total += cost.cost(len(group), padded)
        else:
            best = min(best, total)
    return best


@given(
    buckets_strategy(),
    st.lists(st.integers(1, 400), max_size=8),
    st.integers(1, 8),
    st.sampled_from([0.0, 1.0, 20.0, 64.0, 512.0]),
)
def test_plan_equals_the_best_set_partition_for_small_queues(b, lengths, max_batch, overhead):
    cost = LinearCost(overhead)
    groups = plan_batches(lengths, cost=cost, **plan_inputs(b, max_batch))
    assert plan_cost(groups, cost) == pytest.approx(brute_force_cost(lengths, b, max_batch, cost))


@pytest.mark.parametrize(
    ("overhead", "shared"),
    [(47.0, False), (48.0, True), (49.0, True)],
)
def test_two_rows_share_a_forward_exactly_when_padding_costs_less_than_an_overhead(
    overhead, shared
):
    # rows of 10 and 60 tokens pad to 16 and 64: sharing adds 64 - 16 = 48 padded tokens
    b = Buckets((16, 64), 4096)
    groups = plan_batches([10, 60], cost=LinearCost(overhead), **plan_inputs(b, 8))
    assert (groups == [(64, [0, 1])]) == shared
    if not shared:
        assert groups == [(64, [1]), (16, [0])]


def test_no_rows_give_no_groups():
    b = Buckets((16, 64), 4096)
    assert plan_batches([], **plan_inputs(b, 8)) == []
    assert per_bucket_groups([], **plan_inputs(b, 8)) == []


def test_one_row_runs_alone_at_its_bucket():
    b = Buckets((16, 64), 4096)
    assert plan_batches([17], **plan_inputs(b, 8)) == [(64, [0])]


def test_rows_above_the_last_bucket_are_grouped_by_exact_length():
    b = Buckets((16, 64), 4096)
    lengths = [100, 70, 100, 70, 70, 90]
    groups = plan_batches(lengths, **plan_inputs(b, 8))
    assert sorted(groups) == [(70, [1, 3, 4]), (90, [5]), (100, [0, 2])]


def test_caps_of_one_give_one_row_per_forward():
    b = Buckets((16, 64), 4096)
    lengths = [3, 5, 60, 61, 200]
    for args in (plan_inputs(b, 1), plan_inputs(b, 8) | {"max_rows": b.constant_rows(1)}):
        groups = plan_batches(lengths, **args)
        assert sorted(len(rows) for _, rows in groups) == [1] * 5
        assert_valid_plan(lengths, groups, b, 1)


def test_a_long_row_beside_many_short_ones_does_not_drag_them_to_its_length():
    b = Buckets((16, 32, 64, 128, 256), 1 << 20)
    lengths = [250] + [8] * 63
    groups = plan_batches(lengths, cost=LinearCost(512), **plan_inputs(b, 64))
    assert groups == [(256, [0]), (16, list(range(1, 64)))]
    assert padding_efficiency(lengths, groups) > 10 * padding_efficiency(
        lengths, [(256, list(range(64)))]
    )


@pytest.mark.parametrize(
    ("lengths", "kwargs", "message"),
    [
        ([5, 0], {}, "lengths[1] = 0"),
        ([5], {"max_batch": 0}, "max_batch must be >= 1"),
        ([5], {"max_rows": lambda t: 0}, "no forward can hold a row at padded length 16"),
        ([5], {"pad_len": lambda n: n - 1}, "pad_len(5) = 4 is shorter than the row"),
    ],
)
def test_bad_planner_input_gives_a_clear_error(lengths, kwargs, message):
    b = Buckets((16, 64), 4096)
    with pytest.raises(ValueError) as err:
        plan_batches(lengths, **(plan_inputs(b, 8) | kwargs))
    assert message in str(err.value)


def test_padding_efficiency_counts_real_over_padded_tokens():
    assert padding_efficiency([10, 6], [(16, [0, 1])]) == pytest.approx(0.5)
    assert padding_efficiency([], []) == 1.0
