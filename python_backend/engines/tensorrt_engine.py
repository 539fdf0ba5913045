"""TensorRT engine: one execution context per optimization profile, CUDA graphs per batch size.

Layout, decided once at load:
- profile p serves bucket p (fixed length); an optional last profile serves rows above the last
  bucket at their exact length;
- each profile owns an execution context and device buffers sized for its max shape (ids, mask
  [max_rows * T] int64, output [max_rows, D] fp32), allocated once;
- for each captured batch size of a bucket, one CUDA graph of that context's forward is captured
  at load and replayed at run time: a forward is two host-to-device copies, one replay and one
  device-to-host copy, with no per-call shape setup or kernel selection;
- a group of B rows runs at the next captured size >= B (the scheduler plans with that cost);
  the extra rows hold one real token each so pooling never divides by zero, and are dropped.

GPU memory is held in torch tensors (torch ships in NVIDIA's TensorRT containers), so no other
CUDA binding is needed. A failure raises; the scheduler splits the group and retries.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorrt as trt
import torch

from python_backend.contract import ENGINE_INPUTS
from python_backend.engines.base import BucketLayout
from python_backend.manifest import Manifest

INPUT_NAMES = ENGINE_INPUTS


@dataclass
class _Profile:
    index: int  # TensorRT optimization profile index
    fixed_length: int | None  # the bucket length, or None for the exact-length long-row profile
    max_rows: int
    context: trt.IExecutionContext
    ids: torch.Tensor  # device, int64 [max_rows * max_length]
    mask: torch.Tensor  # device, int64 [max_rows * max_length]
    out: torch.Tensor  # device, fp32 [max_rows, D]
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)  # batch -> graph


class TensorRTEngine:
    """Runs groups on a TensorRT engine built by ``builder/tensorrt_build.py``."""

    def __init__(self, manifest: Manifest, version_dir: Path) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the manifest names a TensorRT engine, but no CUDA device is visible"
            )
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        self.pad_token_id = manifest.pad_token_id
        self.device = torch.device("cuda")
        self.stream = torch.cuda.Stream(device=self.device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(self._logger)
        path = Path(version_dir) / manifest.engine_files[0]
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(
                f"TensorRT could not load {path} (built by another TensorRT version?)"
            )
        expected = len(manifest.buckets) + (1 if manifest.long_rows else 0)
        if self.engine.num_optimization_profiles != expected:
            raise RuntimeError(
                f"{path} has {self.engine.num_optimization_profiles} profiles; "
                f"the manifest describes {expected}"
            )
        max_rows_all = max(
            [b.max_rows for b in manifest.buckets]
            + ([manifest.long_rows.max_rows] if manifest.long_rows else [])
        )
        # pinned staging buffers: host->device copies are then asynchronous DMA
        max_tokens = max_rows_all * manifest.max_length
        self.host_ids = torch.empty(max_tokens, dtype=torch.int64, pin_memory=True)
        self.host_mask = torch.empty(max_tokens, dtype=torch.int64, pin_memory=True)
        self.host_out = torch.empty(
            (max_rows_all, self.output_dim), dtype=torch.float32, pin_memory=True
        )

        self.profiles: list[_Profile] = []
        for i, bucket in enumerate(manifest.buckets):
            self.profiles.append(self._open_profile(i, bucket.length, bucket.max_rows))
        if manifest.long_rows is not None:
            self.long_profile: _Profile | None = self._open_profile(
                len(manifest.buckets), None, manifest.long_rows.max_rows, manifest.max_length
            )
        else:
            self.long_profile = None
        for profile, bucket in zip(self.profiles, manifest.buckets, strict=True):
            for batch in bucket.captured_batch_sizes:
                self._capture(profile, batch, bucket.length)

    def _open_profile(
        self, index: int, length: int | None, max_rows: int, max_length: int | None = None
    ) -> _Profile:
        context = self.engine.create_execution_context()
        if context is None:
            raise RuntimeError(f"TensorRT could not create a context for profile {index}")
        context.set_optimization_profile_async(index, self.stream.cuda_stream)
        tokens = max_rows * (length if length is not None else int(max_length or 0))
        ids = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        mask = torch.zeros(tokens, dtype=torch.int64, device=self.device)
        out = torch.empty((max_rows, self.output_dim), dtype=torch.float32, device=self.device)
        input_ids, attention_mask = ENGINE_INPUTS
        context.set_tensor_address(input_ids, ids.data_ptr())
        context.set_tensor_address(attention_mask, mask.data_ptr())
        context.set_tensor_address(self.output_name, out.data_ptr())
        return _Profile(index, length, max_rows, context, ids, mask, out)

    def _set_shape(self, profile: _Profile, batch: int, length: int) -> None:
        for name in INPUT_NAMES:
            if not profile.context.set_input_shape(name, trt.Dims2(batch, length)):
                raise RuntimeError(f"profile {profile.index} refuses shape [{batch}, {length}]")

    def _enqueue(self, profile: _Profile) -> None:
        if not profile.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"TensorRT forward failed on profile {profile.index}")

    def _capture(self, profile: _Profile, batch: int, length: int) -> None:
        """Captures one forward at [batch, length] into a CUDA graph (after one eager run)."""
        n = batch * length
        with torch.cuda.stream(self.stream):
            profile.ids[:n].fill_(self.pad_token_id)
            profile.mask[:n].fill_(1)
            self._set_shape(profile, batch, length)
            self._enqueue(profile)  # lets TensorRT finish lazy allocations before capture
        self.stream.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=self.stream):
            self._enqueue(profile)
        profile.graphs[batch] = graph

    def _profile_for(self, length: int) -> _Profile:
        i = self.layout.bucket_index(length)
        if i is not None:
            return self.profiles[i]
        if (
            self.long_profile is not None
            and self.layout.lengths[-1] < length <= self.layout.max_length
        ):
            return self.long_profile
        raise ValueError(f"no TensorRT profile runs rows padded to {length} tokens")

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """[B, T] int64 ids and mask -> [B, D] fp32, at the profile of length T."""
        rows, length = input_ids.shape
        profile = self._profile_for(length)
        if rows > profile.max_rows:
            raise ValueError(
                f"{rows} rows exceed the profile's {profile.max_rows} at length {length}"
            )
        batch = self.layout.run_batch_size(length, rows) if profile.fixed_length else rows
        n_real, n_run = rows * length, batch * length
        # stage into pinned memory; rows past the real ones carry one real (pad) token
        self.host_ids[:n_real].numpy()[:] = input_ids.reshape(-1)
        self.host_mask[:n_real].numpy()[:] = attention_mask.reshape(-1)
        with torch.cuda.stream(self.stream):
            profile.ids[:n_real].copy_(self.host_ids[:n_real], non_blocking=True)
            profile.mask[:n_real].copy_(self.host_mask[:n_real], non_blocking=True)
            if n_run > n_real:
                profile.ids[n_real:n_run].fill_(self.pad_token_id)
                filler = profile.mask[n_real:n_run].view(batch - rows, length)
                filler.zero_()
                filler[:, 0] = 1
            graph = profile.graphs.get(batch)
            if graph is not None:
                graph.replay()
            else:
                self._set_shape(profile, batch, length)
                self._enqueue(profile)
            self.host_out[:rows].copy_(profile.out[:rows], non_blocking=True)  # one D2H copy
        self.stream.synchronize()
        return self.host_out[:rows].numpy().copy()

    def close(self) -> None:
        self.stream.synchronize()
        for profile in [*self.profiles, *([self.long_profile] if self.long_profile else [])]:
            profile.graphs.clear()
        self.profiles = []
        self.long_profile = None
