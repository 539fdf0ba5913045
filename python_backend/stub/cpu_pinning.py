"""A core of its own for each front, queue owner and GPU model instance (``pin_cores``).

Why: a one-row request is handed between threads several times on its way through a front
(Triton's ``execute`` thread, the front's I/O thread, the response sender's round trip to Triton)
and through the owner (its I/O thread, its scheduler). Where the threads of one process run on
different cores, each hand-off wakes a thread on another core: an inter-processor interrupt, and
on a virtual machine an exit to the hypervisor. With every thread of a process on one core, the
hand-offs stay on that core (docs/ARCHITECTURE.md, the lever table, has the measurement).

When: ``on``, or ``auto`` where the server has cores of its own (``has_own_cores``). Which core:
the ones this process may run on (``os.sched_getaffinity``: a container's cpuset, a
Kubernetes pod's exclusive cores), one hyperthread of each physical core before the second ones.
Fronts claim from the start of that order, owners (and GPU instances of the one-process model)
from its end, so they meet only when there are more processes than cores. A claim is an exclusive
``flock`` on a file per core in the server's own socket folder: it ends with the process, so a
restarted front or owner claims again. Claims are per server: two servers given the same cores
would pin onto the same ones, which is why ``auto`` pins only inside a cpuset. Where every core
is claimed, the process runs unpinned. Triton's own threads are never pinned: they run wherever
the kernel puts them.

One pool of a pinned process floats: the tokenizer's workers (``with_every_core``). A request of
many rows is tokenized by them in parallel; pinned beside the rest of the process they would take
turns on its one core. A one-row request never reaches them (the tokenizer encodes a single text
on the calling thread), so the hand-offs that pinning keeps on one core stay there.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

# the pin_cores setting's values: always, never, or where this server has cores of its own
PIN_CORES = ("auto", "on", "off")


def has_own_cores() -> bool:
    """Whether this process may run on fewer cores than the machine has: a cpuset given to its
    container (Kubernetes' static CPU manager, ``docker run --cpuset-cpus``). Without one, every
    server on the node would claim the same first cores, so ``auto`` pins only with one."""
    return len(os.sched_getaffinity(0)) < (os.cpu_count() or 0)


def should_pin(setting: str) -> bool:
    """What the ``pin_cores`` setting means here."""
    return setting == "on" or (setting == "auto" and has_own_cores())


@dataclass(frozen=True)
class Claim:
    core: int
    fd: int  # holds the claim's lock for as long as it is open
    # the cores this process could run on before the claim pinned it
    every_core: frozenset[int] = frozenset()

    def release(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


def _sibling_rank(core: int, sysfs: Path) -> int:
    """Which hyperthread of its physical core ``core`` is (0: the first), 0 where unknown."""
    try:
        text = (sysfs / f"cpu{core}" / "topology" / "thread_siblings_list").read_text()
    except OSError:
        return 0
    siblings: list[int] = []
    for part in text.strip().split(","):
        first, _, last = part.partition("-")
        siblings.extend(range(int(first), int(last or first) + 1))
    return sorted(siblings).index(core) if core in siblings else 0


def core_order(cores: Iterable[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> list[int]:
    """``cores`` in the order they are claimed: the first hyperthread of every physical core, then
    the second ones, each in core order."""
    return sorted(cores, key=lambda core: (_sibling_rank(core, sysfs), core))


def claim_core(directory: str, cores: list[int], from_end: bool) -> Claim | None:
    """Claims the first core of ``cores`` (the last, ``from_end``) that no other process of this
    server holds; None where all are held."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for core in reversed(cores) if from_end else cores:
        fd = os.open(os.path.join(directory, f"core-{core}.lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return Claim(core, fd)
    return None


def pin_process(core: int) -> None:
    """Every thread of this process on ``core``; threads started after inherit it. Threads are
    listed twice: one started while the first pass ran is caught by the second."""
    for _ in range(2):
        for task in os.listdir("/proc/self/task"):
            # a thread may end meanwhile
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.sched_setaffinity(int(task), {core})


def pin_to_free_core(directory: str, owner: bool) -> Claim | None:
    """Claims a core for this process and pins every thread of it there: fronts from the start of
    ``core_order``, owners (``owner``) from its end. None (and nothing pinned) where every core
    this process may use is claimed already."""
    every_core = os.sched_getaffinity(0)
    claim = claim_core(directory, core_order(every_core), from_end=owner)
    if claim is None:
        return None
    pin_process(claim.core)
    return replace(claim, every_core=frozenset(every_core))


def with_every_core(claim: Claim | None, start: Callable[[], object]) -> None:
    """Runs ``start`` with the calling thread back on every core this process could use before
    ``claim`` pinned it, then pinned again: the threads ``start`` starts (a library's worker pool,
    which a thread started later would otherwise inherit pinned) keep those cores. Just ``start``
    where nothing is pinned."""
    if claim is None or not claim.every_core:
        start()
        return
    os.sched_setaffinity(0, claim.every_core)
    try:
        start()
    finally:
        os.sched_setaffinity(0, {claim.core})
