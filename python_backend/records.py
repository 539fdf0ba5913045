"""The records of one request and its answer: what every owner takes and gives back, whether it
runs in the model's own process (``owners.LocalOwner``) or in a queue owner across a socket
(``owner_client.RemoteOwner``, ``owner_wire``).

They are plain slotted dataclasses, not frozen ones: a frozen dataclass's __init__ sets each field
through object.__setattr__, about 3x slower, and building records was a fifth of the queue owner's
CPU (docs/ARCHITECTURE.md). Nothing changes them after they are made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from python_backend.contract import ServeError


@dataclass(eq=False, slots=True)
class Answer:
    """A request's outputs."""

    outputs: np.ndarray  # [rows, D] float32, row i for the request's row i
    num_tokens: np.ndarray  # [rows] int32: tokens each row ran with
    queue_s: float = 0.0  # from its arrival to its first forward's start
    inference_s: float = 0.0  # from its first forward's start to its last row computed


Outcome = Answer | ServeError
Respond = Callable[[Outcome], None]


def never_cancelled() -> bool:
    return False


@dataclass(eq=False, slots=True)
class Request:
    """What a client asked for; no owner changes it."""

    rows: list[np.ndarray]  # token ids per row, int64, at least one token each
    respond: Respond  # called exactly once, with an Answer or a ServeError
    deadline: float | None = None  # time.monotonic() after which it must not start computing
    is_cancelled: Callable[[], bool] = never_cancelled  # asked before it costs anything
    client: str = ""  # who sent it: the queue is shared between clients (fair_queue)
