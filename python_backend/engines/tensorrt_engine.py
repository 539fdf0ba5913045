"""TensorRT engine: one execution context per optimization profile, CUDA graphs per batch size.

Layout, decided once at load:
- profile p serves bucket p (fixed length); an optional last profile serves rows above the last
  bucket at their exact length;
- every context runs on one stream, one forward after another, so they share one block of
  activation memory (user-managed allocation, sized by ``device_memory_size_v2``, the largest any
  profile needs) and one set of I/O buffers sized for the largest forward. With TensorRT's
  default (static) allocation each context would reserve the largest profile's activations for
  itself: nine contexts, nine copies;
- for each captured batch size of a bucket, one CUDA graph of that context's forward, captured
  at load in thread-local mode (another thread's CUDA calls cannot invalidate it). A size that
  cannot be captured is logged and runs eagerly; the model still loads;
- a group of B rows runs at the next captured size >= B (the scheduler plans with that cost);
  the extra rows hold one real token each so pooling never divides by zero, and are dropped.

Before any of that, the plan's TensorRT version (from the manifest) must be the running one,
and its I/O tensors must be the ones bound here (``tensorrt_checks``). GPU memory is held in
torch tensors on the device Triton names for the model instance. A failure at run time raises;
the scheduler splits the group and retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorrt as trt
import torch

from python_backend.contract import ENGINE_INPUTS, TOKEN_TYPE_INPUT, split_token_types
from python_backend.engines.base import BucketLayout
from python_backend.engines.tensorrt_checks import (
    IOTensor,
    capture_all,
    check_io_contract,
    require_built_by,
)
from python_backend.manifest import Manifest


@dataclass
class _Profile:
    index: int  # TensorRT optimization profile index
    fixed_length: int | None  # the bucket length, or None for the exact-length long-row profile
    max_rows: int
    context: trt.IExecutionContext
    graphs: dict[int, torch.cuda.CUDAGraph] = field(default_factory=dict)  # batch -> graph
    eager_sizes: set[int] = field(default_factory=set)  # sizes whose capture failed


def _log_warning(message: str) -> None:
    print(f"TensorRTEngine: {message}", flush=True)


def _clear_cuda_error() -> None:
    """A failed capture leaves its error as the runtime's last error: clear it, or the next
    unrelated launch check reports it."""
    try:
        from cuda.bindings import runtime as cudart  # ships with torch's CUDA 13 wheels

        cudart.cudaGetLastError()
    except ImportError:
        torch.cuda.synchronize()


class TensorRTEngine:
    """Runs groups on a TensorRT engine built by ``builder/tensorrt_build.py``."""

    def __init__(
        self,
        manifest: Manifest,
        version_dir: Path,
        device_id: int = 0,
        log: Callable[[str], None] = _log_warning,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the manifest names a TensorRT engine, but no CUDA device is visible"
            )
        path = Path(version_dir) / manifest.engine_files[0]
        require_built_by(manifest.engine_version, trt.__version__, path)
        self._log = log
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        self.pad_token_id = manifest.pad_token_id
        self.device = torch.device("cuda", device_id)
        torch.cuda.set_device(self.device)  # TensorRT allocates on the current device
        self.stream = torch.cuda.Stream(device=self.device)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not load {path} (see the TensorRT log above)")
        self.pair_input = manifest.pair_input
        self.input_names = (
            (*ENGINE_INPUTS, TOKEN_TYPE_INPUT) if self.pair_input else tuple(ENGINE_INPUTS)
        )
        check_io_contract(self._io_tensors(), self.output_name, self.pair_input)
        expected = len(manifest.buckets) + (1 if manifest.long_rows else 0)
        if self.engine.num_optimization_profiles != expected:
            raise RuntimeError(
                f"{path} has {self.engine.num_optimization_profiles} profiles; "
                f"the manifest describes {expected}"
            )

        # one activation block and one set of I/O buffers, shared by every context
        self.activation_bytes = int(self.engine.device_memory_size_v2)
        self.activations = torch.empty(
            max(self.activation_bytes, 1), dtype=torch.uint8, device=self.device
        )
        max_rows_all = max(
            [b.max_rows for b in manifest.buckets]
            + ([manifest.long_rows.max_rows] if manifest.long_rows else [])
        )
        max_tokens = max(
            [b.max_rows * b.length for b in manifest.buckets]
            + ([manifest.long_rows.max_rows * manifest.max_length] if manifest.long_rows else [])
        )
        self.ids = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        self.mask = torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
        # pair models' token types (all zero, and unbound, for the other families)
        self.types = torch.zeros(
            max_tokens if self.pair_input else 1, dtype=torch.int64, device=self.device
        )
        self.out = torch.empty(
            (max_rows_all, self.output_dim), dtype=torch.float32, device=self.device
        )
        # pinned staging buffers: host<->device copies are then asynchronous DMA
        self.host_ids = torch.empty(max_tokens, dtype=torch.int64, pin_memory=True)
        self.host_mask = torch.empty(max_tokens, dtype=torch.int64, pin_memory=True)
        self.host_types = torch.empty(
            max_tokens if self.pair_input else 1, dtype=torch.int64, pin_memory=True
        )
        self.host_out = torch.empty(
            (max_rows_all, self.output_dim), dtype=torch.float32, pin_memory=True
        )

        self.profiles: list[_Profile] = [
            self._open_profile(i, bucket.length, bucket.max_rows)
            for i, bucket in enumerate(manifest.buckets)
        ]
        self.long_profile: _Profile | None = None
        if manifest.long_rows is not None:
            self.long_profile = self._open_profile(
                len(manifest.buckets), None, manifest.long_rows.max_rows
            )
        sizes = [
            (i, batch)
            for i, bucket in enumerate(manifest.buckets)
            for batch in bucket.captured_batch_sizes
        ]
        graphs, eager = capture_all(sizes, self._capture, self._log)
        for (i, batch), graph in graphs.items():
            self.profiles[i].graphs[batch] = graph  # type: ignore[assignment]
        for i, batch in eager:
            self.profiles[i].eager_sizes.add(batch)
            self._forward_eagerly(self.profiles[i], batch, self.profiles[i].fixed_length or 1)
        self.stream.synchronize()

    def _io_tensors(self) -> list[IOTensor]:
        tensors = []
        for i in range(self.engine.num_io_tensors):
            name = self.engine.get_tensor_name(i)
            tensors.append(
                IOTensor(
                    name=name,
                    is_input=self.engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT,
                    dtype=self.engine.get_tensor_dtype(name).name,
                    rank=len(self.engine.get_tensor_shape(name)),
                )
            )
        return tensors

    def _open_profile(self, index: int, length: int | None, max_rows: int) -> _Profile:
        context = self.engine.create_execution_context(
            trt.ExecutionContextAllocationStrategy.USER_MANAGED
        )
        if context is None:
            raise RuntimeError(f"TensorRT could not create a context for profile {index}")
        context.set_device_memory(self.activations.data_ptr(), self.activation_bytes)
        context.set_optimization_profile_async(index, self.stream.cuda_stream)
        input_ids, attention_mask = ENGINE_INPUTS
        context.set_tensor_address(input_ids, self.ids.data_ptr())
        context.set_tensor_address(attention_mask, self.mask.data_ptr())
        if self.pair_input:
            context.set_tensor_address(TOKEN_TYPE_INPUT, self.types.data_ptr())
        context.set_tensor_address(self.output_name, self.out.data_ptr())
        return _Profile(index, length, max_rows, context)

    def _set_shape(self, profile: _Profile, batch: int, length: int) -> None:
        for name in self.input_names:
            if not profile.context.set_input_shape(name, trt.Dims2(batch, length)):
                raise RuntimeError(f"profile {profile.index} refuses shape [{batch}, {length}]")

    def _enqueue(self, profile: _Profile) -> None:
        if not profile.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"TensorRT forward failed on profile {profile.index}")

    def _forward_eagerly(self, profile: _Profile, batch: int, length: int) -> None:
        """One forward of pad rows at [batch, length], without a graph (warm-up, or the check
        that a size whose capture failed still runs)."""
        n = batch * length
        with torch.cuda.stream(self.stream):
            self.ids[:n].fill_(self.pad_token_id)
            self.mask[:n].fill_(1)
            if self.pair_input:
                self.types[:n].fill_(0)
            self._set_shape(profile, batch, length)
            self._enqueue(profile)
        self.stream.synchronize()

    def _capture(self, index: int, batch: int) -> torch.cuda.CUDAGraph:
        """Captures one forward of bucket ``index`` at ``batch`` rows into a CUDA graph."""
        profile = self.profiles[index]
        length = int(profile.fixed_length or 0)
        # an eager run first lets TensorRT finish lazy allocations outside the capture
        self._forward_eagerly(profile, batch, length)
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, stream=self.stream, capture_error_mode="thread_local"):
                self._enqueue(profile)
        except Exception:
            _clear_cuda_error()
            raise
        return graph

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
        return self._run(input_ids, attention_mask, use_graph=True)

    def run_eagerly(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """``run`` without the CUDA graph: re-shapes the context (gpu_check's eager pass)."""
        return self._run(input_ids, attention_mask, use_graph=False)

    def _run(
        self, input_ids: np.ndarray, attention_mask: np.ndarray, use_graph: bool
    ) -> np.ndarray:
        rows, length = input_ids.shape
        profile = self._profile_for(length)
        if rows > profile.max_rows:
            raise ValueError(
                f"{rows} rows exceed the profile's {profile.max_rows} at length {length}"
            )
        batch = self.layout.run_batch_size(length, rows) if profile.fixed_length else rows
        n_real, n_run = rows * length, batch * length
        # stage into pinned memory; rows past the real ones carry one real (pad) token
        if self.pair_input:  # token types ride in the ids' high bits (contract)
            input_ids, types = split_token_types(input_ids)
            self.host_types[:n_real].numpy()[:] = types.reshape(-1)
        self.host_ids[:n_real].numpy()[:] = input_ids.reshape(-1)
        self.host_mask[:n_real].numpy()[:] = attention_mask.reshape(-1)
        with torch.cuda.stream(self.stream):
            self.ids[:n_real].copy_(self.host_ids[:n_real], non_blocking=True)
            self.mask[:n_real].copy_(self.host_mask[:n_real], non_blocking=True)
            if self.pair_input:
                self.types[:n_real].copy_(self.host_types[:n_real], non_blocking=True)
                self.types[n_real:n_run].fill_(0)
            if n_run > n_real:
                self.ids[n_real:n_run].fill_(self.pad_token_id)
                filler = self.mask[n_real:n_run].view(batch - rows, length)
                filler.zero_()
                filler[:, 0] = 1
            graph = profile.graphs.get(batch) if use_graph else None
            if graph is not None:
                graph.replay()
            else:
                self._set_shape(profile, batch, length)
                self._enqueue(profile)
            self.host_out[:rows].copy_(self.out[:rows], non_blocking=True)  # one D2H copy
        self.stream.synchronize()
        return self.host_out[:rows].numpy().copy()

    def memory_bytes(self) -> dict[str, int]:
        """Device memory the engine holds, by what it is for (gpu_check prints it)."""
        io = (self.ids.numel() + self.mask.numel() + self.types.numel()) * 8 + self.out.numel() * 4
        return {"activations": self.activation_bytes, "io_buffers": io}

    def close(self) -> None:
        self.stream.synchronize()
        for profile in [*self.profiles, *([self.long_profile] if self.long_profile else [])]:
            profile.graphs.clear()
        self.profiles = []
        self.long_profile = None
