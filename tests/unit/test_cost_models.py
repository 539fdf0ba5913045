from __future__ import annotations

import math

import pytest

from python_backend.common.cost_models import (
    LinearCost,
    MeasuredCost,
    cost_model_from_dict,
    cost_row,
    linear_to_dict,
)


def table() -> MeasuredCost:
    # times grow faster than linearly in T (attention) and step at captured batch sizes
    return MeasuredCost(
        lengths=(16, 64),
        batch_sizes=(1, 8, 32),
        times_us=((100.0, 180.0, 420.0), (150.0, 600.0, 2400.0)),
        us_per_token=1.0,
        captured_batch_sizes=(1, 2, 4, 8, 16, 32),
    )


def test_linear_cost_is_overhead_plus_padded_tokens():
    assert LinearCost(512).cost(4, 64) == 512 + 4 * 64
    assert list(cost_row(LinearCost(10), 16, 3)) == [0, 26, 42, 58]


def test_measured_cost_returns_measured_points_exactly():
    cost = table()
    assert cost.cost(8, 16) == pytest.approx(180.0)
    assert cost.cost(32, 64) == pytest.approx(2400.0)


def test_measured_cost_pads_a_batch_up_to_the_next_captured_size():
    cost = table()
    assert cost.cost(5, 16) == cost.cost(8, 16)
    assert cost.cost(9, 16) == cost.cost(16, 16)
    assert cost.cost(9, 16) > cost.cost(8, 16)


def test_measured_cost_interpolates_between_lengths_and_extrapolates_batches():
    cost = table()
    mid = cost.cost(8, 40)
    assert cost.cost(8, 16) < mid < cost.cost(8, 64)
    assert mid == pytest.approx(180 + (600 - 180) * (40 - 16) / (64 - 16))
    # past the largest measured batch the last segment's slope continues
    assert cost.cost(64, 16) == pytest.approx(420 + (420 - 180) / 24 * 32)
    # above the last length, time scales with the tokens
    assert cost.cost(32, 128) == pytest.approx(2 * 2400.0)


def test_cost_models_round_trip_through_a_manifest_dict():
    cost = table()
    assert cost_model_from_dict(cost.to_dict()) == cost
    assert cost_model_from_dict(linear_to_dict(LinearCost(77))) == LinearCost(77)


def test_unknown_cost_kind_is_named_in_the_error():
    with pytest.raises(ValueError, match=r"cost_model\.kind"):
        cost_model_from_dict({"kind": "quadratic"})


def test_measured_cost_rejects_a_malformed_table():
    with pytest.raises(ValueError, match="times_us must have shape"):
        MeasuredCost((16,), (1, 2), ((1.0,),), 1.0)
    with pytest.raises(ValueError, match="positive time at batch 1"):
        MeasuredCost((16,), (1,), ((math.nan,),), 1.0)


def test_negative_overhead_is_refused():
    with pytest.raises(ValueError, match="overhead_tokens"):
        LinearCost(-1)
