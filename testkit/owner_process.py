"""A queue owner over the fake engine, in a process of its own (the owner's failure tests kill
it). Run as ``python -m testkit.owner_process ENDPOINT [--blocked] [--overlap]``: ``--blocked``
holds every forward until the process is killed, so requests stay in flight; ``--overlap`` runs
its forwards on an engine thread (``overlap_forwards``)."""

from __future__ import annotations

import argparse
import signal
import threading

from python_backend.common.cost_models import LinearCost
from python_backend.scheduling.owners import LocalOwner
from python_backend.scheduling.scheduler import Scheduler
from python_backend.transport.queue_owner import FRONT_SILENT_S, QueueOwner
from testkit.fake_engine import FakeChecksumEngine, layout


def fake_owner(
    endpoint: str,
    gate: threading.Event | None = None,
    front_silent_s: float | None = None,
    overlap: bool = False,
    vocab_size: int | None = None,
) -> QueueOwner:
    """A queue owner (not started) over a fake engine of buckets 16, 32, 64 and 8 rows each; its
    forwards on an engine thread with ``overlap``."""
    engine = FakeChecksumEngine(layout(), gate=gate)
    scheduler = Scheduler(
        engine,
        0,
        LinearCost(16),
        max_batch=8,
        max_queue_rows=1000,
        overlap=overlap,
        vocab_size=vocab_size,
    )
    return QueueOwner(
        LocalOwner(scheduler, engine, responder=False),
        endpoint,
        FakeChecksumEngine.output_dim,
        front_silent_s=FRONT_SILENT_S if front_silent_s is None else front_silent_s,
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("endpoint")
    parser.add_argument("--blocked", action="store_true")
    parser.add_argument("--overlap", action="store_true")
    args = parser.parse_args()
    gate = threading.Event() if args.blocked else None
    owner = fake_owner(args.endpoint, gate, overlap=args.overlap)
    owner.start()
    print("ready", flush=True)
    stopped = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopped.set())
    stopped.wait()
    if gate is not None:
        gate.set()
    owner.stop(5.0)


if __name__ == "__main__":
    main()
