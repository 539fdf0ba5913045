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
from python_backend.engines.base import BucketLayout
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

    riders = True  # a higher class's forwards take the next class's rows (ServiceClasses)

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
    """A layout whose forwards hold at most ``budget`` padded tokens as the engine runs them (at
    a captured batch size, where it captured any): for re-planning a failure, and the cap."""

    def __init__(self, base: BucketLayout, budget: int) -> None:
        self.base, self.budget = base, budget
        self.max_batch = base.max_batch
        self._rows: dict[int, int] = {}

    def pad_len(self, num_tokens: int) -> int:
        return self.base.pad_len(num_tokens)

    def max_rows(self, padded_length: int) -> int:
        rows = self._rows.get(padded_length)
        if rows is None:
            rows = max(1, min(self.base.max_rows(padded_length), self.budget // padded_length))
            while rows > 1 and self.base.run_batch_size(padded_length, rows) * padded_length > (
                self.budget
            ):
                rows -= 1
            self._rows[padded_length] = rows
        return rows

    def mergeable(self, num_tokens: int) -> bool:
        return self.base.mergeable(num_tokens)


@dataclass(frozen=True)
class ServiceClasses:
    """How the scheduler serves classes of requests (``Request.priority``, 1 first).

    A step takes the highest class waiting; rows of the next class ride in its forwards where
    one more row costs less than its share of a forward of its own (a forward may run longer
    than its own rows for riders of that length, and a request may ride in part). A higher
    class's row may wait about ``wait_s`` for a lower class: while a higher class is waiting or
    was seen within ``recent_s``, a lower class's forwards are capped so that one holds the
    engine about ``wait_s`` at most (``capped_layout``), the step yields after any forward once
    a higher class waits (its first forward carries those that came while the one before it
    ran, where they fit: ``Scheduler._carry_latecomers``), and riders take what the row has not
    waited of it, or make its forward cost ``rider_factor`` times its own, whichever is more
    (``Scheduler._rider_budget``). A lower class with rows waiting whose share of the engine's
    recent work (cost units, decaying over ``share_window_s``) is under ``min_share`` is served
    first, capped, so no class starves."""

    classes: int = 2
    wait_s: float = 0.05
    recent_s: float = 1.0
    min_share: float = 0.05
    share_window_s: float = 2.0
    rider_factor: float = 2.0


def capped_layout(
    base: BucketLayout, cost: CostModel, wait_s: float, seconds_per_unit: float
) -> BudgetLayout:
    """``base`` with forwards of at most the padded tokens whose cost takes ``wait_s``: the
    forward's fixed cost (a one-row forward at the shortest length, less that length) comes off
    the units ``wait_s`` buys. One row always fits."""
    shortest = base.pad_len(1)
    fixed = max(0.0, cost.cost(1, shortest) - shortest)
    units = wait_s / seconds_per_unit
    return BudgetLayout(base, max(1, int(units - fixed)))
