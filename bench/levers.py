"""Bench only: the changes ``bench.ceiling_levers`` pulls inside a variant's stub process, as real
code (ruff and mypy see it). A variant's generated model.py calls ``pull(name)`` before it
imports the model; the project's own code never calls it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _no_cancel_check_at_admit() -> None:
    """``is_cancelled`` asked only before a forward, not at admission."""
    from python_backend.scheduler import Scheduler

    def admit(self: Any, collection: list[Any]) -> list[Any]:
        return [owner for owner in collection if not owner.done]

    Scheduler.admit = admit  # type: ignore[method-assign]


def _no_cancel_check() -> None:
    """``is_cancelled`` never asked."""
    from python_backend.scheduler import Scheduler

    _no_cancel_check_at_admit()
    Scheduler._without_unwanted = lambda self, forward: forward  # type: ignore[method-assign]


PATCHES: dict[str, Callable[[], None]] = {
    "no-cancel-check-at-admit": _no_cancel_check_at_admit,
    "no-cancel-check": _no_cancel_check,
}


def pull(name: str) -> None:
    PATCHES[name]()
