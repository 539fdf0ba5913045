"""The engine's optimization profiles as one value, computed once and read by everyone.

The builder derives it from the bucket layout (``engine_profiles``) and records it in the
manifest; the TensorRT builder makes one optimization profile from each entry, in order, and
both runtimes read their buffer sizes, bindings and CUDA-graph sizes from it. Nobody derives the
order or the shapes a second time.

Order and shapes (each shape [B, T]):
- one profile per bucket, ascending: T fixed at the bucket length (min = opt = max), B from 1 to
  the bucket's max rows, tuned at its opt rows, CUDA graphs at its captured batch sizes;
- then, when rows may run above the last bucket, the long-row profile: T from the last bucket + 1
  to the max length (each row at its exact length, tuned at ``opt_length``), B from 1 to its max
  rows, no graphs (its shapes vary).

``input_names`` are the graph's inputs, in order, every one [B, T] int64: the ids and the mask,
and the token types for families that take them (``contract.TOKEN_TYPE_INPUT``). Engines bind
and fill inputs by looping over these names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from python_backend.common.contract import ENGINE_INPUTS

Shape = tuple[int, int]  # [B, T]


@dataclass(frozen=True)
class Bucket:
    """One engine profile: rows padded to ``length`` tokens, 1..max_rows rows per forward."""

    length: int  # padded sequence length of every row in the profile
    max_rows: int  # most rows in one forward: rows x length within the token budget
    opt_rows: int  # the batch TensorRT tunes kernels for
    captured_batch_sizes: tuple[int, ...] = ()  # CUDA-graph sizes (ascending, last = max_rows)


@dataclass(frozen=True)
class LongRows:
    """Rows between the last bucket and ``max_length``: run at their exact length, never merged."""

    max_rows: int  # most rows of one length in one forward
    opt_length: int  # the length TensorRT tunes this dynamic profile for
    opt_rows: int = 1  # the batch TensorRT tunes it for (builder.opt_shapes)


@dataclass(frozen=True)
class EngineProfile:
    """One optimization profile: the shapes it takes, and the batch sizes captured as graphs."""

    min_shape: Shape
    opt_shape: Shape  # the shape TensorRT tunes kernels for
    max_shape: Shape
    captured_batch_sizes: tuple[int, ...] = ()  # ascending, last = max rows; () for none
    # the long-row profile, marked: each row at its exact length. Never read from the shapes:
    # with the last bucket one below the max length, its lengths are min = max too
    exact_lengths: bool = False

    @property
    def fixed_length(self) -> int | None:
        """The bucket length every row of this profile runs at; None for the long-row one."""
        return None if self.exact_lengths else self.min_shape[1]

    @property
    def max_rows(self) -> int:
        return self.max_shape[0]

    @property
    def max_tokens(self) -> int:
        return self.max_shape[0] * self.max_shape[1]


@dataclass(frozen=True)
class EngineProfiles:
    input_names: tuple[str, ...]  # the graph's inputs, in order: [B, T] int64 each
    profiles: tuple[EngineProfile, ...]  # in TensorRT profile order (buckets, then long rows)

    @property
    def buckets(self) -> tuple[EngineProfile, ...]:
        return tuple(p for p in self.profiles if not p.exact_lengths)

    @property
    def long_rows(self) -> EngineProfile | None:
        last = self.profiles[-1]
        return last if last.exact_lengths else None

    @property
    def max_rows(self) -> int:
        """Rows the largest forward of any profile holds (the output buffer's height)."""
        return max(p.max_rows for p in self.profiles)

    @property
    def max_tokens(self) -> int:
        """Padded tokens the largest forward of any profile holds (the input buffers' size)."""
        return max(p.max_tokens for p in self.profiles)

    def to_dict(self) -> dict[str, Any]:
        return {
            "input_names": list(self.input_names),
            "profiles": [
                {
                    "min_shape": list(p.min_shape),
                    "opt_shape": list(p.opt_shape),
                    "max_shape": list(p.max_shape),
                    "captured_batch_sizes": list(p.captured_batch_sizes),
                }
                for p in self.profiles
            ],
        }


def engine_profiles(
    buckets: Sequence[Bucket],
    long_rows: LongRows | None,
    max_length: int,
    input_names: Sequence[str] = ENGINE_INPUTS,
) -> EngineProfiles:
    """The profiles of a bucket layout (the manifest's buckets and long-row range): the one
    derivation of the profiles' order and shapes."""
    profiles = [
        EngineProfile(
            (1, b.length), (b.opt_rows, b.length), (b.max_rows, b.length), b.captured_batch_sizes
        )
        for b in buckets
    ]
    if long_rows is not None:
        last = buckets[-1].length
        profiles.append(
            EngineProfile(
                (1, last + 1),
                (long_rows.opt_rows, long_rows.opt_length),
                (long_rows.max_rows, max_length),
                exact_lengths=True,
            )
        )
    return EngineProfiles(tuple(input_names), tuple(profiles))
