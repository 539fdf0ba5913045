"""Bench only: the served model over an emulated engine (see bench/emulated_engine.py). Imported
only inside Triton's Python-backend stub, where triton_python_backend_utils exists."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.emulated_engine import TABLE_FILE, EmulatedEngine, table_seconds
from python_backend.split_models import OwnerModel
from python_backend.triton_model import TritonPythonModel


def emulated_engine(manifest: Any, version_dir: Path) -> EmulatedEngine:
    spec = (Path(version_dir) / TABLE_FILE).read_text().strip()
    return EmulatedEngine(manifest, table_seconds(spec))


class EmulatedEngineModel(TritonPythonModel):
    def open_engine(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        return emulated_engine(manifest, version_dir)


class EmulatedOwnerModel(OwnerModel):
    """The split layout's queue owner over the emulated engine (the fronts are the real ones)."""

    def open_engine(self, manifest: Any, version_dir: Path, device_id: int) -> Any:
        return emulated_engine(manifest, version_dir)
