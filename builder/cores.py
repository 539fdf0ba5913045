"""How many fronts a GPU gets by default: from the CPU cores the server will have.

In the split layout (docs/ARCHITECTURE.md) every request costs CPU in Triton, in a front and in
the queue owner, and a front serves at most one request per its serial time (its CPU plus the
hand-offs between Triton and its stub). Fronts stop being the bound once K / serial time reaches
what the cores allow, C / (the server's CPU per request): K = C x serial / CPU per request.
Measured here for one-row requests, the case that needs the most fronts (`python -m
bench.cpu_model measure --pin-cores both` at commit 300a3c7, docs/PERFORMANCE.md; today `python -m
bench.serving --layouts one,fronts:1,fronts:2 --pin-cores both` measures the same): 736 us of a
front's serial time against 910 us of CPU per request (Triton 316, a front 557, the owner 37),
so 0.8 of the cores; with 64-row requests 0.7 would do.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

FRONT_SHARE = 0.8  # a front's serial time over the server's CPU per request (above)
MAX_FRONTS_PER_GPU = 16  # one owner feeds this many at most (its own core bounds it past that)


def fronts_for(cores_per_gpu: float) -> int:
    """The default fronts per GPU for this many cores per GPU: at least one."""
    return max(1, min(MAX_FRONTS_PER_GPU, round(cores_per_gpu * FRONT_SHARE)))


def quota_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The cgroup's CPU limit in cores (a container's `cpus`, a pod's `limits.cpu`), if any:
    cgroup v2's cpu.max, else v1's cfs quota."""
    try:
        quota, period = (cgroup / "cpu.max").read_text().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((cgroup / "cpu" / "cpu.cfs_quota_us").read_text())
        period_us = int((cgroup / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    except (OSError, ValueError):
        return None


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, within its cgroup's limit."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    quota = quota_cores()
    if quota is not None:
        cores = min(cores or 1, max(1, math.ceil(quota)))
    return max(1, cores or 1)


def visible_gpus() -> int:
    """The GPUs this process sees (torch's count; 1 where it sees none, as a CPU build)."""
    try:
        import torch
    except ImportError:
        return 1
    return max(1, torch.cuda.device_count() if torch.cuda.is_available() else 1)


def default_fronts(
    on_gpu: bool, cores: int | None, gpus: tuple[int, ...] | None, instances_per_gpu: int
) -> int:
    """--fronts auto: on a GPU, ``fronts_for`` the cores per GPU; 0 on the CPU (the engine takes
    the cores there: the split gave 0.94x-0.99x of one process, docs/ARCHITECTURE.md), and 0
    beside several instances per GPU (each its own queue)."""
    if not on_gpu or instances_per_gpu > 1:
        return 0
    per_gpu = (cores or usable_cores()) / (len(gpus) if gpus else visible_gpus())
    return fronts_for(per_gpu)
