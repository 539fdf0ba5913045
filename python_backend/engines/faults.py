"""Fault injection for the reliability tests: an engine wrapper that fails on purpose.

Only a test model repository enables it, with a file of its own beside the manifest
(``faults.txt`` in the version folder). It is never read from the environment or from
config.pbtxt, and the builder never writes that file, so a production model cannot inject faults
by a stray setting. The file holds one spec, a comma-separated list of:
- ``oom_above_tokens=N``: a forward of more than N padded tokens raises MemoryError, like a GPU
  out of memory;
- ``poison_token=ID``: a forward holding a row with this token id raises RuntimeError, like a row
  that breaks the engine whatever it is grouped with;
- ``delay_ms=N``: every forward waits N ms before it runs, like an engine busy for that long
  without a CPU core (a GPU): queued requests wait behind it while the tests' own CPU is free.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from python_backend.engines.base import Engine

FAULTS_FILE = "faults.txt"
FAULT_KEYS = ("oom_above_tokens", "poison_token", "delay_ms")


class InjectedFault(RuntimeError):
    pass


def load_fault_spec(version_dir: Path) -> str | None:
    """The spec of a test repository's ``faults.txt``, or None (every production model)."""
    path = Path(version_dir) / FAULTS_FILE
    return path.read_text().strip() if path.is_file() else None


def write_fault_spec(version_dir: Path, spec: str) -> Path:
    """For test repositories: makes the model in ``version_dir`` inject these faults."""
    parse_fault_spec(spec)  # refuse a bad spec here, not at model load
    path = Path(version_dir) / FAULTS_FILE
    path.write_text(spec + "\n")
    return path


def parse_fault_spec(spec: str) -> dict[str, int]:
    faults: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        key, _, value = item.partition("=")
        if key not in FAULT_KEYS or not value.strip().isdigit():
            raise ValueError(
                f"fault spec item {item!r}: expected oom_above_tokens=N, poison_token=ID or "
                "delay_ms=N"
            )
        faults[key] = int(value)
    return faults


class FaultInjectingEngine:
    """Wraps an engine; fails forwards as the spec says, else runs them unchanged."""

    def __init__(self, inner: Engine, spec: str) -> None:
        self.inner = inner
        self.layout = inner.layout
        self.output_name = inner.output_name
        self.output_dim = inner.output_dim
        self.faults = parse_fault_spec(spec)
        self.forwards_failed = 0

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        delay_ms = self.faults.get("delay_ms")
        if delay_ms:
            time.sleep(delay_ms / 1e3)
        limit = self.faults.get("oom_above_tokens")
        if limit is not None and input_ids.size > limit:
            self.forwards_failed += 1
            raise MemoryError(
                f"injected out of memory: {input_ids.shape[0]}x{input_ids.shape[1]} = "
                f"{input_ids.size} tokens > {limit}"
            )
        poison = self.faults.get("poison_token")
        if poison is not None and bool(((input_ids == poison) & (attention_mask == 1)).any()):
            self.forwards_failed += 1
            raise InjectedFault(f"injected engine fault on token id {poison}")
        return self.inner.run(input_ids, attention_mask)

    def close(self) -> None:
        self.inner.close()
