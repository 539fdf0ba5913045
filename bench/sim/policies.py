"""The peers' batchers as policies inside this project's scheduler loop (an approximation of
those servers, which differ in everything else), and the project's own planners by name."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bench.errors import BenchError
from python_backend.common.cost_models import CostModel
from python_backend.scheduling.planner import PLANNERS, Group, PlanLayout
from python_backend.scheduling.policy import Policy, PolicyPlan, QueuedRows

# -- the peers' batchers, as policies in this project's loop ------------------------------------


def padded_to_longest(lengths: Sequence[int], members: list[int]) -> Group:
    return max(lengths[i] for i in members), members


class PeerBatcher(Policy):
    """What the peers' batchers share: batches padded to their longest row, and a failed batch
    retried row by row at each row's own length; no request rides in another class's batch."""

    riders = False

    def regroup(self, lengths: Sequence[int], layout: PlanLayout, cost: CostModel) -> list[Group]:
        return [padded_to_longest(lengths, [i]) for i in range(len(lengths))]


class DynamicBatcher(PeerBatcher):
    """Triton's dynamic batcher: a batch leaves when it reaches the preferred size or its oldest
    row has waited ``max_delay_s``; rows in arrival order, padded to the batch's longest."""

    def __init__(self, max_batch: int = 64, max_delay_s: float = 0.002) -> None:
        super().__init__(PLANNERS["per_bucket"], "dynamic_batcher")
        self.max_batch, self.max_delay_s = max_batch, max_delay_s

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        due = min(rows.arrived_at) + self.max_delay_s
        if len(rows) < self.max_batch and now < due:
            return PolicyPlan([], list(range(len(rows))), due)
        order = list(range(len(rows)))
        groups = [
            padded_to_longest(rows.num_tokens, order[a : a + self.max_batch])
            for a in range(0, len(order), self.max_batch)
        ]
        return PolicyPlan(groups)


class TokenBudget(PeerBatcher):
    """FIFO batches under a token budget counted as rows x longest row (TEI's max_batch_tokens)."""

    def __init__(self, max_tokens: int = 16384, max_batch: int = 64) -> None:
        super().__init__(PLANNERS["per_bucket"], "token_budget")
        self.max_tokens, self.max_batch = max_tokens, max_batch

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        groups: list[Group] = []
        members: list[int] = []
        longest = 0
        for i, n in enumerate(rows.num_tokens):
            grown = max(longest, n)
            if members and (
                grown * (len(members) + 1) > self.max_tokens or len(members) >= self.max_batch
            ):
                groups.append(padded_to_longest(rows.num_tokens, members))
                members, grown = [], n
            members.append(i)
            longest = grown
        if members:
            groups.append(padded_to_longest(rows.num_tokens, members))
        return PolicyPlan(groups)


class SortedWindow(PeerBatcher):
    """Up to ``batch_size`` rows at a time, sorted by length, each batch padded to its longest
    (Infinity's batch handler)."""

    def __init__(self, batch_size: int = 64) -> None:
        super().__init__(PLANNERS["per_bucket"], "sorted_window")
        self.batch_size = batch_size

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        order = sorted(range(len(rows)), key=lambda i: rows.num_tokens[i])
        groups = [
            padded_to_longest(rows.num_tokens, sorted(order[a : a + self.batch_size]))
            for a in range(0, len(order), self.batch_size)
        ]
        return PolicyPlan(groups)


class BoundedWait(Policy):
    """The DP planner, but while fewer than ``min_rows`` rows are queued it waits, at most
    ``max_wait_s`` past the oldest row's arrival, for a fuller collection."""

    def __init__(self, max_wait_s: float, min_rows: int = 32) -> None:
        super().__init__(PLANNERS["dp"], f"dp_wait:{max_wait_s * 1e3:g}")
        self.max_wait_s, self.min_rows = max_wait_s, min_rows

    def plan(self, rows: QueuedRows, now: float, layout: PlanLayout, cost: CostModel) -> PolicyPlan:
        due = min(rows.arrived_at) + self.max_wait_s
        if len(rows) < self.min_rows and now < due:
            return PolicyPlan([], list(range(len(rows))), due)
        return super().plan(rows, now, layout, cost)


def make_policy(name: str) -> Policy:
    peers: dict[str, Callable[[], Policy]] = {
        "dynamic_batcher": DynamicBatcher,
        "token_budget": TokenBudget,
        "sorted_window": SortedWindow,
    }
    if name in PLANNERS:
        return Policy(PLANNERS[name], name)
    if name.startswith("dp_wait:"):
        return BoundedWait(float(name.partition(":")[2]) / 1e3)
    if name in peers:
        return peers[name]()
    raise BenchError(f"no policy {name!r}; known: {', '.join([*PLANNERS, *peers])}")


POLICIES = ("dp", "per_bucket", "dynamic_batcher", "token_budget", "sorted_window")
