"""An emulated engine for bench repositories only: each forward takes the time a cost table
gives for its shape, waiting instead of computing, and returns zeros (its outputs are never real).

Served by the real Triton server in place of ONNX Runtime, it shows what the server around the
engine costs when forwards run at GPU speed: with a table of zeros, the most rows/s the server
sustains is its own ceiling. A bench repository selects it with its own model.py
(``EMULATED_MODEL_PY``) and the table with its own ``emulated_table.txt`` (``table:a30``, ``table:a30*20``
for forwards 20 times as long, or ``zero``); the builder never writes either, and ``model_repository/`` never holds them.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from bench.cost_tables import cost_table
from python_backend.common.manifest import Manifest
from python_backend.engines.base import BucketLayout

TABLE_FILE = "emulated_table.txt"

EMULATED_MODEL_PY = '''"""Bench only: the project's model over an emulated engine (bench/emulated_engine.py)."""

from bench.emulated_model import EmulatedEngineModel as TritonPythonModel

__all__ = ["TritonPythonModel"]
'''


class EmulatedEngine:
    """The manifest's layout and output size, with forwards that only take time (the real
    engine is never loaded)."""

    def __init__(self, manifest: Manifest, seconds: Any) -> None:
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        self.seconds = seconds  # (rows, padded length) -> seconds

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        rows, length = input_ids.shape
        wait = self.seconds(rows, length)
        if wait > 0:
            time.sleep(wait)
        return np.zeros((rows, self.output_dim), dtype=np.float32)  # finite: answered

    def close(self) -> None:
        pass


def table_seconds(spec: str) -> Any:
    if spec == "zero":
        return lambda rows, length: 0.0
    return cost_table(spec).seconds
