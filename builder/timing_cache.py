"""The TensorRT timing cache: reused across builds when it fits, started afresh when it does not.

A cache records kernel timings for one GPU model and TensorRT version. One made elsewhere (a
volume shared by nodes of another GPU type, an image upgrade) is refused by
``set_timing_cache(..., ignore_mismatch=False)``, which returns False rather than raising; a
truncated file may not even parse. Either way the build goes on with a fresh cache, and the
cache written afterwards replaces the stale one. Neither reading nor writing the cache can fail
a build: it only saves time.

No TensorRT import here: ``config`` is an ``IBuilderConfig`` on a GPU node and a stand-in in the
unit tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any


def use_timing_cache(config: Any, path: Path, log: Callable[[str], None]) -> str:
    """Attaches the cache at ``path`` to ``config``; returns "reused", "fresh" or "replaced"."""
    data = b""
    if path.is_file():
        try:
            data = path.read_bytes()
        except OSError as err:
            log(f"timing cache {path} is unreadable ({err}); starting a fresh one")
    if data:
        try:
            cache = config.create_timing_cache(data)
        except Exception as err:  # TensorRT raises on bytes that are not a cache at all
            cache, reason = None, str(err)
        else:
            reason = "made by another GPU or TensorRT version"
        if cache is not None and config.set_timing_cache(cache, ignore_mismatch=False):
            return "reused"
        log(f"timing cache {path} does not fit this build ({reason}); starting a fresh one")
    cache = config.create_timing_cache(b"")
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise RuntimeError("TensorRT refused an empty timing cache")
    return "replaced" if data else "fresh"


def save_timing_cache(
    config: Any, path: Path, log: Callable[[str], None], fallback: Path | None = None
) -> Path | None:
    """Writes the build's timing cache to ``path``, else to ``fallback``; returns where it went.
    A failure is logged, never raised.

    A shared cache volume is often not writable by the image's user (Kubernetes applies fsGroup
    to few ReadWriteMany volumes): the build still read what it could, and keeps its own
    timings in a per-pod ``fallback`` so a restarted container re-times nothing.
    """
    try:
        serialized = memoryview(config.get_timing_cache().serialize())
    except Exception as err:
        log(f"timing cache not saved: TensorRT did not serialize it ({err})")
        return None
    for target in (path, fallback):
        if target is None:
            continue
        try:
            write_atomically(target, serialized)
        except OSError as err:
            log(f"timing cache not saved to {target}: {err}")
            continue
        if target != path:
            log(f"timing cache saved to {target} instead (per pod); make {path.parent} writable")
        return target
    return None


def write_atomically(path: Path, data: bytes | memoryview) -> None:
    """Readers see the old file or the new one, never half of one (a crash mid-write, or two
    builds sharing a volume). ``data`` may be TensorRT's own buffer: it is written, not copied."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
