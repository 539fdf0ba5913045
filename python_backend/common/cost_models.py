"""Cost models for the batch planner.

A cost model prices one forward of ``num_rows`` rows padded to ``padded_length`` tokens, in
token-units: the time of one forward divided by the time of one real token processed in a large
batch. Only relative costs matter to the planner, so any consistent unit is exact; token-units keep
the numbers readable (an overhead of 512 means "one forward's fixed cost is worth 512 padded
tokens").

Every model here is a frozen, hashable dataclass: the planner caches per-model tables (cost rows
and the best split of identical rows) keyed by the model itself.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

DEFAULT_OVERHEAD_TOKENS = 512.0
# the server reads it (python_backend/settings.py) to override the cost model with LinearCost
OVERHEAD_ENV_VAR = "PLANNER_OVERHEAD_TOKENS"


def next_captured_size(captured: Sequence[int], num_rows: int) -> int:
    """The batch an engine really runs for ``num_rows``: the smallest captured size that holds
    them (CUDA graphs), or the rows themselves where none does (or none was captured)."""
    j = bisect.bisect_left(captured, num_rows)
    return captured[j] if j < len(captured) else num_rows


def over_lengths(lengths: Sequence[int], at: Callable[[int], float], padded_length: int) -> float:
    """A quantity known at each bucket length (``at(i)`` for ``lengths[i]``), at any padded
    length: linear between two bucket lengths, in proportion to the length below the first and
    above the last (the per-token cost of the nearest bucket)."""
    if padded_length >= lengths[-1]:
        return at(len(lengths) - 1) * padded_length / lengths[-1]
    if padded_length <= lengths[0]:
        return at(0) * padded_length / lengths[0]
    hi = bisect.bisect_left(lengths, padded_length)
    lo = hi - 1
    w = (padded_length - lengths[lo]) / (lengths[hi] - lengths[lo])
    return at(lo) + w * (at(hi) - at(lo))


class CostModel(Protocol):
    """Anything that prices a forward by (group size, padded length) only."""

    def cost(self, num_rows: int, padded_length: int) -> float: ...


def cost_row(model: CostModel, padded_length: int, max_rows: int) -> np.ndarray:
    """Costs of forwards of 0..max_rows rows at ``padded_length``: shape [max_rows + 1].

    Index 0 is 0 (an empty forward costs nothing); the planner never uses it as a group.
    """
    vectorised = getattr(model, "cost_row", None)
    if vectorised is not None:
        row = np.asarray(vectorised(padded_length, max_rows), dtype=np.float64)
    else:
        row = np.array(
            [0.0] + [float(model.cost(b, padded_length)) for b in range(1, max_rows + 1)],
            dtype=np.float64,
        )
    if row.shape != (max_rows + 1,) or not np.all(np.isfinite(row[1:])) or np.any(row[1:] < 0):
        raise ValueError(
            f"cost model {model!r} gave invalid costs at padded_length={padded_length}: "
            "every cost must be finite and non-negative"
        )
    return row


@dataclass(frozen=True)
class LinearCost:
    """``overhead_tokens + num_rows * padded_length``: fixed cost per forward plus padded tokens."""

    overhead_tokens: float = DEFAULT_OVERHEAD_TOKENS

    def __post_init__(self) -> None:
        if not np.isfinite(self.overhead_tokens) or self.overhead_tokens < 0:
            raise ValueError(f"overhead_tokens must be finite and >= 0, got {self.overhead_tokens}")

    def cost(self, num_rows: int, padded_length: int) -> float:
        return self.overhead_tokens + num_rows * padded_length

    def affine_row(self, padded_length: int) -> tuple[float, float]:
        """(overhead, cost per row) at this length: the planner's closed forms use it."""
        return float(self.overhead_tokens), float(padded_length)

    def cost_row(self, padded_length: int, max_rows: int) -> np.ndarray:
        row = self.overhead_tokens + np.arange(max_rows + 1, dtype=np.float64) * padded_length
        row[0] = 0.0
        return row


@dataclass(frozen=True)
class MeasuredCost:
    """Forward times measured on a grid of (batch size, bucket length), in token-units.

    - ``lengths``: measured padded lengths, ascending (the bucket lengths).
    - ``batch_sizes``: measured batch sizes, ascending, starting at 1.
    - ``times_us[i][j]``: median forward time at ``lengths[i]`` x ``batch_sizes[j]``; NaN where the
      engine does not take that batch at that length.
    - ``us_per_token``: the unit: time of one token in a full batch, so costs read as tokens.
    - ``captured_batch_sizes``: batch sizes the engine really runs (CUDA graphs); a forward of B
      rows costs what the smallest captured size >= B costs. Empty: every size runs as itself.

    Between measured points the time is interpolated linearly in B and in T; because every bucket
    length is measured, attention's faster-than-linear growth in T is in the table itself. Past the
    last measured point the last segment is extended (batch sizes), or scaled by the last measured
    time per token (lengths above the last bucket).
    """

    lengths: tuple[int, ...]
    batch_sizes: tuple[int, ...]
    times_us: tuple[tuple[float, ...], ...]
    us_per_token: float
    captured_batch_sizes: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.lengths or list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError("MeasuredCost.lengths must be non-empty, ascending and distinct")
        if not self.batch_sizes or list(self.batch_sizes) != sorted(set(self.batch_sizes)):
            raise ValueError("MeasuredCost.batch_sizes must be non-empty, ascending and distinct")
        if self.batch_sizes[0] < 1 or self.lengths[0] < 1:
            raise ValueError("MeasuredCost batch sizes and lengths must be >= 1")
        if len(self.times_us) != len(self.lengths) or any(
            len(r) != len(self.batch_sizes) for r in self.times_us
        ):
            raise ValueError(
                "MeasuredCost.times_us must have shape [len(lengths), len(batch_sizes)]"
            )
        for length, row in zip(self.lengths, self.times_us, strict=True):
            if not np.isfinite(row[0]) or row[0] <= 0:
                raise ValueError(f"MeasuredCost needs a positive time at batch 1, length {length}")
        if not self.us_per_token > 0:
            raise ValueError("MeasuredCost.us_per_token must be > 0")
        if list(self.captured_batch_sizes) != sorted(set(self.captured_batch_sizes)):
            raise ValueError("MeasuredCost.captured_batch_sizes must be ascending and distinct")

    def _time_at_length_index(self, i: int, batch: float) -> float:
        row = np.asarray(self.times_us[i], dtype=np.float64)
        sizes = np.asarray(self.batch_sizes, dtype=np.float64)
        ok = np.isfinite(row)
        row, sizes = row[ok], sizes[ok]
        if len(sizes) == 1:
            return float(row[0] * batch / sizes[0])
        if batch <= sizes[-1]:
            return float(np.interp(batch, sizes, row))
        slope = (row[-1] - row[-2]) / (sizes[-1] - sizes[-2])
        return float(row[-1] + max(slope, 0.0) * (batch - sizes[-1]))

    def time_us(self, num_rows: int, padded_length: int) -> float:
        """Interpolated forward time of ``num_rows`` rows at ``padded_length``."""
        batch = float(self._run_batch(num_rows))
        return over_lengths(
            self.lengths, lambda i: self._time_at_length_index(i, batch), padded_length
        )

    def _run_batch(self, num_rows: int) -> int:
        return next_captured_size(self.captured_batch_sizes, num_rows)

    def cost(self, num_rows: int, padded_length: int) -> float:
        return self.time_us(num_rows, padded_length) / self.us_per_token

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "measured",
            "lengths": list(self.lengths),
            "batch_sizes": list(self.batch_sizes),
            "times_us": [[None if not np.isfinite(t) else t for t in r] for r in self.times_us],
            "us_per_token": self.us_per_token,
            "captured_batch_sizes": list(self.captured_batch_sizes),
        }


@dataclass(frozen=True)
class BucketAffineCost:
    """``overhead + num_rows * row_cost(T)``: a fit of measured forward times, in token-units.

    ``row_cost`` is measured at each bucket length (so attention's faster-than-linear growth in T
    is in it), interpolated linearly between them and scaled per token above the last one. Being
    affine in the number of rows, it keeps the planner on its closed-form path.
    """

    overhead_tokens: float
    lengths: tuple[int, ...]
    row_costs: tuple[float, ...]

    def __post_init__(self) -> None:
        if not np.isfinite(self.overhead_tokens) or self.overhead_tokens < 0:
            raise ValueError(f"overhead_tokens must be finite and >= 0, got {self.overhead_tokens}")
        if not self.lengths or list(self.lengths) != sorted(set(self.lengths)):
            raise ValueError("BucketAffineCost.lengths must be non-empty, ascending and distinct")
        if len(self.row_costs) != len(self.lengths) or not all(
            np.isfinite(c) and c > 0 for c in self.row_costs
        ):
            raise ValueError("BucketAffineCost.row_costs must be one positive cost per length")

    def row_cost(self, padded_length: int) -> float:
        return over_lengths(self.lengths, lambda i: self.row_costs[i], padded_length)

    def affine_row(self, padded_length: int) -> tuple[float, float]:
        return float(self.overhead_tokens), self.row_cost(padded_length)

    def cost(self, num_rows: int, padded_length: int) -> float:
        return self.overhead_tokens + num_rows * self.row_cost(padded_length)

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": "affine",
            "overhead_tokens": self.overhead_tokens,
            "lengths": list(self.lengths),
            "row_costs": list(self.row_costs),
        }


# the cost models a manifest stores
StoredCost = LinearCost | BucketAffineCost | MeasuredCost


def _number(data: dict[str, object], key: str) -> float:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"cost_model.{key} must be a number, got {value!r}")
    return float(value)


def _sequence(data: dict[str, object], key: str, default: object = None) -> list[object]:
    value = data.get(key, default)
    if not isinstance(value, list | tuple):
        raise TypeError(f"cost_model.{key} must be a list, got {value!r}")
    return list(value)


def _ints(data: dict[str, object], key: str, default: object = None) -> tuple[int, ...]:
    return tuple(int(_number({key: x}, key)) for x in _sequence(data, key, default))


def _floats(data: dict[str, object], key: str) -> tuple[float, ...]:
    return tuple(_number({key: x}, key) for x in _sequence(data, key))


def cost_model_from_dict(data: dict[str, object]) -> StoredCost:
    """Reads a cost model stored in a manifest (the inverse of ``cost_model_to_dict``)."""
    kind = data.get("kind")
    if kind == "linear":
        return LinearCost(_number(data, "overhead_tokens"))
    if kind == "affine":
        return BucketAffineCost(
            overhead_tokens=_number(data, "overhead_tokens"),
            lengths=_ints(data, "lengths"),
            row_costs=_floats(data, "row_costs"),
        )
    if kind == "measured":
        times = tuple(
            tuple(float("nan") if t is None else _number({"times_us": t}, "times_us") for t in row)
            for row in (_sequence({"row": r}, "row") for r in _sequence(data, "times_us"))
        )
        return MeasuredCost(
            lengths=_ints(data, "lengths"),
            batch_sizes=_ints(data, "batch_sizes"),
            times_us=times,
            us_per_token=_number(data, "us_per_token"),
            captured_batch_sizes=_ints(data, "captured_batch_sizes", ()),
        )
    raise ValueError(f"cost_model.kind must be 'linear', 'affine' or 'measured', got {kind!r}")


def cost_model_to_dict(model: StoredCost) -> dict[str, object]:
    """What a manifest stores for a cost model."""
    if isinstance(model, LinearCost):
        return {"kind": "linear", "overhead_tokens": model.overhead_tokens}
    return model.to_dict()


def linear_to_dict(model: LinearCost) -> dict[str, object]:
    return cost_model_to_dict(model)
