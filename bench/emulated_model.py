"""Bench only: the served model over an emulated engine (see bench/emulated_engine.py). Imported
only inside Triton's Python-backend stub, where triton_python_backend_utils exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.emulated_engine import TABLE_FILE, EmulatedEngine, table_seconds
from python_backend.triton_model import TritonPythonModel


class EmulatedEngineModel(TritonPythonModel):
    def open_engine(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        spec = (Path(version_dir) / TABLE_FILE).read_text().strip()
        return EmulatedEngine(manifest, table_seconds(spec))
