"""The torch engine: the model's own torch module on a CUDA GPU with CUDA graphs (FP16 for
encoders, BF16 or FP32 for decoders, whose activations overflow FP16), or FP32 on the CPU.

Where it runs is the manifest's ``runs_on_gpu``: a GPU build runs on the GPU Triton names for the
model instance, a CPU build in FP32 (no graphs there: every group at its exact shape, as ONNX
Runtime runs it). The module is rebuilt from the build's record and weights (``torch_modules``),
with SDPA attention, in the manifest's precision; its pooling computes in FP32 whatever that is.

On the GPU, decided once at load:
- one CUDA graph per (bucket, captured batch size), captured from the largest down, every graph
  in one memory pool (forwards run one at a time on the instance's stream);
- a group of B rows runs at the next captured size >= B, the rows past the real ones pad rows;
- a size whose capture failed, and every row above the last bucket, runs eagerly at its exact
  shape (logged at load for the former).
The device, the stream, the I/O buffers, pad rows and capture with its fallback are
``cuda_graphs.CudaForwards``, shared with the TensorRT engine; this module brings the forward.
A failure at run time raises; the scheduler splits the group and retries.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import cast

import numpy as np
import torch

from python_backend.common.manifest import Manifest
from python_backend.engines.base import BucketLayout, graph_inputs
from python_backend.engines.cuda_graphs import CudaForwards, Graph, capture_all
from python_backend.engines.torch_modules import DTYPES, TORCH_RECORD, load_torch_model


def _log_warning(message: str) -> None:
    print(f"torch engine: {message}", file=sys.stderr, flush=True)


class TorchEngine:
    """The family module on one device; on a GPU, a CUDA graph per captured size."""

    def __init__(
        self,
        manifest: Manifest,
        version_dir: Path,
        device_id: int = 0,
        log: Callable[[str], None] = _log_warning,
    ) -> None:
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        self.precision = manifest.precision
        self.input_names = manifest.engine_profiles.input_names
        self.cuda: CudaForwards | None = None
        self.graphs: dict[tuple[int, int], Graph] = {}
        self.eager_sizes: list[tuple[int, int]] = []  # captured sizes that run without a graph
        folder = Path(version_dir) / Path(manifest.engine_files[-1]).parent
        if not (folder / TORCH_RECORD).is_file():
            raise RuntimeError(
                f"the manifest names a torch engine, but {folder} has no {TORCH_RECORD}"
            )
        if not manifest.runs_on_gpu:
            self.device = torch.device("cpu")
            self.module = load_torch_model(folder, DTYPES[manifest.precision], self.device)
            return
        self.cuda = CudaForwards.for_manifest(manifest, device_id, engine="torch")
        self.device = self.cuda.device
        if manifest.precision == "bf16" and not torch.cuda.is_bf16_supported(
            including_emulation=False
        ):
            raise RuntimeError(
                f"the manifest names a BF16 torch engine, and {torch.cuda.get_device_name(self.device)} "
                "does not compute BF16 (compute capability 8.0 and later do): rebuild the model "
                "on this GPU (its default is then FP32), or with --precision fp32"
            )
        self.module = load_torch_model(folder, DTYPES[manifest.precision], self.device)
        # largest forward first: later, smaller graphs reuse the pool's blocks
        sizes = sorted(
            (
                (i, batch)
                for i, b in enumerate(self.layout.buckets)
                for batch in b.captured_batch_sizes
            ),
            key=lambda size: -self.layout.buckets[size[0]].length * size[1],
        )
        captured, self.eager_sizes = capture_all(sizes, self._capture, log)
        self.graphs = {size: cast(Graph, g) for size, g in captured.items()}
        for bucket, batch in self.eager_sizes:  # a size that could not be captured still runs
            length = self.layout.buckets[bucket].length
            self.cuda.forward_pad_rows(batch, length, self._launch(batch, length))

    def _launch(self, batch: int, length: int) -> Callable[[], None]:
        """A forward of the staged [batch, length] rows into the shared output buffer."""
        assert self.cuda is not None
        cuda = self.cuda

        def launch() -> None:
            with torch.no_grad():
                out = self.module(*cuda.input_views(batch, length))
                cuda.out[:batch].copy_(out)

        return launch

    def _capture(self, bucket: int, batch: int) -> Graph:
        assert self.cuda is not None
        length = self.layout.buckets[bucket].length
        return self.cuda.capture(batch, length, self._launch(batch, length))

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        rows, length = input_ids.shape
        if self.cuda is None:
            return self._run_on_cpu(input_ids, attention_mask)
        bucket = self.layout.bucket_index(length)
        batch = self.layout.run_batch_size(length, rows)
        graph = self.graphs.get((bucket, batch)) if bucket is not None else None
        if graph is not None:
            return self.cuda.run(input_ids, attention_mask, batch, graph.replay)
        return self.run_eagerly(input_ids, attention_mask)

    def run_eagerly(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The same rows without a graph, at exactly their shape (gpu_check compares the two)."""
        if self.cuda is None:
            return self._run_on_cpu(input_ids, attention_mask)
        rows, length = input_ids.shape
        return self.cuda.run(input_ids, attention_mask, rows, self._launch(rows, length))

    def _run_on_cpu(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        tensors = graph_inputs(input_ids, attention_mask)
        with torch.no_grad():
            out = self.module(*(torch.as_tensor(tensors[name]) for name in self.input_names))
        return out.numpy().astype(np.float32, copy=False)

    def memory_bytes(self) -> dict[str, int]:
        """Device memory the engine holds, by what it is for (gpu_check prints it)."""
        weights = sum(p.numel() * p.element_size() for p in self.module.parameters())
        io = self.cuda.io_bytes() if self.cuda is not None else 0
        return {"weights": weights, "io_buffers": io}

    def close(self) -> None:
        if self.cuda is not None:
            self.cuda.synchronize()
        self.graphs = {}
        self.module = None  # type: ignore[assignment]
