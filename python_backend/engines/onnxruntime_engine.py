"""ONNX Runtime engine: the CPU default, with the CUDA provider where onnxruntime-gpu is present.

ONNX Runtime takes any shape, so a group runs at exactly (rows, bucket length): no captured batch
sizes, no profiles. Threads: intra-op threads default to the cores Triton leaves us
(``ORT_INTRA_OP_THREADS`` overrides); one forward at a time, so no inter-op pool.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from python_backend.common.manifest import Manifest
from python_backend.engines.base import BucketLayout, graph_inputs


def session_options() -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    threads = int(os.environ.get("ORT_INTRA_OP_THREADS", "0"))
    options.intra_op_num_threads = threads  # 0: one per physical core
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


def providers(device: str) -> list[str]:
    """CUDA first where asked for (or auto) and available, then CPU."""
    available = ort.get_available_providers()
    if device in ("auto", "cuda") and "CUDAExecutionProvider" in available:
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    if device == "cuda":
        raise RuntimeError("device=cuda asked for, but onnxruntime has no CUDAExecutionProvider")
    return ["CPUExecutionProvider"]


class OnnxRuntimeEngine:
    """One ONNX Runtime session over ``model.onnx``; runs each group at its exact shape."""

    def __init__(self, manifest: Manifest, version_dir: Path, device: str = "auto") -> None:
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        path = Path(version_dir) / manifest.engine_files[0]
        self.session = ort.InferenceSession(
            str(path), sess_options=session_options(), providers=providers(device)
        )
        self.provider = self.session.get_providers()[0]
        self.input_names = manifest.engine_profiles.input_names

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        tensors = graph_inputs(input_ids, attention_mask)
        feed = {name: tensors[name] for name in self.input_names}
        (out,) = self.session.run([self.output_name], feed)
        return np.asarray(out, dtype=np.float32)

    def close(self) -> None:
        self.session = None  # type: ignore[assignment]
