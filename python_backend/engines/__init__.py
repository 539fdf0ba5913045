"""Engines run one planned group at its bucket: ONNX Runtime (CPU default), TensorRT (GPU), or
the model's own torch module (with CUDA graphs on a GPU, FP32 on the CPU)."""

from __future__ import annotations

from pathlib import Path

from python_backend.common.manifest import Manifest
from python_backend.engines.base import BucketLayout, Engine

__all__ = ["BucketLayout", "Engine", "open_engine"]


def open_engine(
    manifest: Manifest, version_dir: Path, device: str = "auto", device_id: int = 0
) -> Engine:
    """The engine the manifest names, loaded from ``version_dir``; one that runs on a GPU runs on
    GPU ``device_id`` (the one Triton names for the model instance)."""
    if manifest.engine_kind == "torch":
        from python_backend.engines.torch_engine import TorchEngine

        return TorchEngine(manifest, version_dir, device_id=device_id)
    if manifest.engine_kind == "tensorrt":
        from python_backend.engines.tensorrt_engine import TensorRTEngine

        return TensorRTEngine(manifest, version_dir, device_id=device_id)
    from python_backend.engines.onnxruntime_engine import OnnxRuntimeEngine

    return OnnxRuntimeEngine(manifest, version_dir, device=device)
