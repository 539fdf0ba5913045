"""The policy: which queued rows a step runs now, and how they are grouped into forwards.

A policy sees only plain data (each row's length and its request's arrival time, ``QueuedRows``)
and returns groups of row indices (``PolicyPlan``): no tensors, no requests. The base policy runs
everything at once with one planner (``planner.PLANNERS``); a policy that waits (the simulator's
peers: a bounded wait for a fuller collection, a dynamic batcher's queue delay) overrides ``plan``.
A failed forward's rows are grouped again by the same planner under a smaller token budget
(``regroup``, ``BudgetLayout``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from python_backend.common.cost_models import CostModel
from python_backend.scheduling.planner import PLANNERS, Group, PlanLayout, Planner


@dataclass(frozen=True)
class QueuedRows:
    """What a policy sees of the rows it plans, column by column: no tensors, no requests."""

    num_tokens: list[int]  # row i's length in tokens
    arrived_at: list[float]  # clock time row i's request arrived

    def __len__(self) -> int:
        return len(self.num_tokens)


@dataclass(frozen=True)
class PolicyPlan:
    """A policy's answer for the rows it was shown (indices into that list)."""

    groups: list[Group]  # (padded length, row indices): forwards to run now
    waiting: list[int] = field(default_factory=list)  # rows left queued for a later step
    wake_at: float | None = None  # clock time to plan again if nothing arrives (waiting only)


class Policy:
    """Decides, at a step's ``now``, which queued rows run and how they are grouped.

    The base policy runs everything at once with one planner; a policy that waits (a bounded wait
    for a fuller collection, a dynamic batcher's max queue delay) is a sibling that overrides
    ``plan`` and returns ``waiting`` rows and a ``wake_at``."""

    def __init__(self, planner: Planner, name: str = "") -> None:
        self.planner = planner
        self.name = name or getattr(planner, "__name__", "policy")

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        return PolicyPlan(self.planner(rows.num_tokens, layout, cost))

    def regroup(self, lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> list[Group]:
        """Rows of a failed forward, grouped again under a smaller layout: the same planner."""
        return self.planner(lengths, layout, cost)


def policy_named(name: str) -> Policy:
    """The policy for a configured planner name (a key of ``planner.PLANNERS``)."""
    if name not in PLANNERS:
        raise ValueError(f"no planner named {name!r}; known: {', '.join(PLANNERS)}")
    return Policy(PLANNERS[name], name)


class BudgetLayout:
    """A layout whose forwards hold at most ``budget`` padded tokens: for re-planning a failure."""

    def __init__(self, base: PlanLayout, budget: int) -> None:
        self.base, self.budget = base, budget
        self.max_batch = base.max_batch

    def pad_len(self, num_tokens: int) -> int:
        return self.base.pad_len(num_tokens)

    def max_rows(self, padded_length: int) -> int:
        return max(1, min(self.base.max_rows(padded_length), self.budget // padded_length))

    def mergeable(self, num_tokens: int) -> bool:
        return self.base.mergeable(num_tokens)
