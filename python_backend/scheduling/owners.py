"""An owner: what queues, plans and runs a model's requests, behind one handle.

Every role of the Triton model (``triton_model``) hands its decoded requests to an owner through
the same four calls: ``submit`` a ``Request`` (its ``respond`` is called once, with an ``Answer``
or a ``ServeError``), ``start``, ``ready``, ``stop``. There are two:

- ``LocalOwner``: the scheduler and the engine in this process. Its ``submit`` is the
  scheduler's own: nothing is encoded and no thread is crossed before the queue. The one-process
  model serves through one, and so does a queue owner (``transport.queue_owner.QueueOwner`` puts
  a socket in front of it for its fronts).
- ``transport.remote_owner.RemoteOwner``: a queue owner in another process, over a Unix
  socket: what a front of the split layout serves through.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from python_backend.common.contract import SHUTDOWN_DRAIN_S
from python_backend.common.manifest import Manifest
from python_backend.engines import open_engine
from python_backend.engines.base import Engine
from python_backend.scheduling.records import Request
from python_backend.scheduling.scheduler import Scheduler


class Owner(Protocol):
    def submit(self, request: Request) -> None:
        """Queues ``request``, or answers it at once (queue full, no owner, stopping)."""

    def start(self) -> None:
        """Returns once requests can be submitted; raises RuntimeError saying why not."""

    def ready(self) -> bool:
        """Whether a request submitted now can be served (Triton's readiness)."""

    def stop(self, timeout_s: float = SHUTDOWN_DRAIN_S) -> None:
        """Stops taking requests; what was taken is answered (computed, or refused)."""


class EngineSource:
    """Where a local owner's engine comes from: the one its manifest names. Bench repositories
    use another source, whose engine only emulates a GPU's times (bench/emulated_model.py)."""

    def open(self, manifest: Manifest, version_dir: Path, device_id: int) -> Engine:
        return open_engine(manifest, version_dir, device_id=device_id)

    def computes_on_cpu(self, manifest: Manifest) -> bool:
        """Whether the engine's forwards take the CPU's cores (ONNX Runtime on the CPU): its
        process is never pinned to one of them (``pin_cores``), nor are its engine's threads."""
        return not manifest.runs_on_gpu


class LocalOwner:
    """The scheduler over this process's engine. ``responder``: answers leave through a thread
    of their own (off where ``respond`` only hands the answer on, as a queue owner's does)."""

    def __init__(
        self,
        scheduler: Scheduler,
        engine: Engine,
        log: Callable[[str], None] = lambda message: None,
        responder: bool = True,
        description: str = "",
    ) -> None:
        self.scheduler, self.engine = scheduler, engine
        self.log, self.responder = log, responder
        self.description = description  # what it serves with, for the load's log line

    def submit(self, request: Request) -> None:
        self.scheduler.submit(request)  # straight into the queue: no encoding, no thread hop

    def start(self) -> None:
        self.scheduler.start(responder=self.responder)

    def ready(self) -> bool:
        return True

    def stop(self, timeout_s: float = SHUTDOWN_DRAIN_S) -> None:
        """Drains the queue and closes the engine, unless a forward still runs at ``timeout_s``:
        closing the engine under it could crash the process."""
        drained = self.scheduler.stop(timeout_s)
        if drained:
            self.engine.close()
        else:
            self.log(
                f"a forward was still running {timeout_s:.0f} s into shutdown; the engine is "
                "left to the process exit"
            )
