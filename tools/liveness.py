"""python3 -m tools.liveness URL [--misses 3] [--timeout-s 4]: a liveness probe for a container
runtime that does not restart an unhealthy container (docker compose restarts only one that
exited). Run as the container's healthcheck: exit 0 when URL answers 200; after ``--misses``
failures in a row, SIGKILL to the children of the container's first process, so the container
exits and its restart policy starts it again: a wedged helper is restarted like a dead one.
The container runs with an init (compose's ``init: true``): a wedged event loop never reads a
SIGTERM, and a container's own first process cannot be killed from inside it. Kubernetes has
this built in (a livenessProbe's failureThreshold): there the plain check is enough.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
from pathlib import Path

from tools.triton_server import answers_ok, child_processes


def probe(url: str, misses: int, timeout_s: float, state: Path, pid: int = 1) -> int:
    """0 when ``url`` answered; 1 when not (and ``pid``'s children killed at the ``misses``-th)."""
    if answers_ok(url, timeout_s):
        state.unlink(missing_ok=True)
        return 0
    missed = int(state.read_text() or 0) + 1 if state.exists() else 1
    state.write_text(str(missed))
    if missed >= misses:
        print(f"{url} missed {missed} probes in a row: stopping the container", file=sys.stderr)
        state.unlink(missing_ok=True)
        for child, _comm, _state in child_processes(pid):
            os.kill(child, signal.SIGKILL)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("url")
    parser.add_argument("--misses", type=int, default=3)
    parser.add_argument("--timeout-s", type=float, default=4.0)
    args = parser.parse_args(argv)
    name = "".join(c if c.isalnum() else "_" for c in args.url)
    state = Path(tempfile.gettempdir()) / f"liveness-{name}"
    return probe(args.url, args.misses, args.timeout_s, state)


if __name__ == "__main__":
    sys.exit(main())
