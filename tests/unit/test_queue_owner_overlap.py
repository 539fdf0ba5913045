"""The queue owner over a scheduler whose forwards run on an engine thread (``overlap``, the
default where the engine runs on a GPU): every test of the owner's side of the boundary again
(a silent front's rows dropped, cancellations, a killed and a restarted owner), with a forward
in flight while the owner receives, cancels and answers."""

from __future__ import annotations

import functools

import pytest

import tests.unit.test_queue_owner as owner_tests
from tests.unit.test_queue_owner import *  # noqa: F403 (every test, collected again here)


@pytest.fixture(autouse=True)
def overlapped_owners(monkeypatch):
    """The owners those tests make overlap their forwards: in this process, and in a process of
    their own (the tests that kill one)."""
    for name in ("fake_owner", "start_owner_process"):
        made = getattr(owner_tests, name)
        monkeypatch.setattr(owner_tests, name, functools.partial(made, overlap=True))


def test_the_owners_here_overlap_their_forwards(tmp_path):
    # the tests collected above are only worth running twice if their owners really overlap
    assert owner_tests.fake_owner(f"ipc://{tmp_path}/owner.sock").owner.scheduler.overlaps
    assert owner_tests.start_owner_process.keywords == {"overlap": True}
