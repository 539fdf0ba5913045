"""TensorRT engine: one execution context per (profile, captured batch size), CUDA graphs on them.

Layout, decided once at load:
- profile p serves bucket p (fixed length); an optional last profile serves rows above the last
  bucket at their exact length;
- every context runs on one stream, one forward after another, so all of them share one block of
  activation memory (user-managed allocation, sized by ``device_memory_size_v2``, the largest any
  profile needs) and one set of I/O buffers sized for the largest forward. With TensorRT's
  default (static) allocation each context would reserve the largest profile's activations;
- each captured batch size of a bucket has a context of its own: its input shape is set once,
  warmed, captured into a CUDA graph (thread-local capture mode: another thread's CUDA calls
  cannot invalidate it) and never changed, as TensorRT's CUDA-graph guidance asks (a graph
  replays the state its context had at capture). Every profile also has one eager context,
  re-shaped for each forward at a size without a graph: uncaptured sizes, sizes whose capture
  failed (logged; the model still loads), and every row of the long-row profile. TensorRT 10
  always lets several contexts share a profile; where one refuses anyway, that profile's graphs
  are captured on its eager context as before (logged);
- a group of B rows runs at the next captured size >= B (the scheduler plans with that cost).

The device, the stream, the I/O buffers, pad rows and capture with its fallback are
``cuda_graphs.CudaForwards``, shared with the torch engine; this module adds the contexts.

Before any of that, the TensorRT major must be the supported one, the plan's TensorRT version
(from the manifest) the running one, and its I/O tensors the ones bound here
(``tensorrt_checks``). GPU memory is held in torch tensors on the device Triton names for the
model instance. A failure at run time raises; the scheduler splits the group and retries.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import tensorrt as trt
import torch

from python_backend.common.manifest import Manifest
from python_backend.engines.base import BucketLayout
from python_backend.engines.cuda_graphs import CudaForwards, Graph, capture_all
from python_backend.engines.tensorrt_checks import (
    IOTensor,
    check_io_contract,
    context_slots,
    require_built_by,
    require_supported_major,
)


@dataclass
class _Context:
    """An execution context and what it serves."""

    profile: int  # TensorRT optimization profile index
    context: trt.IExecutionContext
    batch: int | None  # the captured batch size its shape is fixed at; None: re-shaped (eager)
    graph: Graph | None = None


@dataclass
class _Profile:
    index: int  # TensorRT optimization profile index
    fixed_length: int | None  # the bucket length, or None for the exact-length long-row profile
    max_rows: int
    eager: _Context  # re-shaped for every forward that has no graph
    graphs: dict[int, _Context] = field(default_factory=dict)  # batch -> captured context
    eager_sizes: set[int] = field(default_factory=set)  # captured sizes whose capture failed


def _log_warning(message: str) -> None:
    print(f"TensorRTEngine: {message}", flush=True)


class TensorRTEngine:
    """Runs groups on a TensorRT engine built by ``builder/tensorrt_build.py``."""

    def __init__(
        self,
        manifest: Manifest,
        version_dir: Path,
        device_id: int = 0,
        log: Callable[[str], None] = _log_warning,
    ) -> None:
        path = Path(version_dir) / manifest.engine_files[0]
        require_supported_major(trt.__version__)
        require_built_by(manifest.engine_version, trt.__version__, path)
        self._log = log
        self.layout = BucketLayout.from_manifest(manifest)
        self.output_name = manifest.output_name
        self.output_dim = manifest.output_dim
        profiles = manifest.engine_profiles
        # one set of I/O buffers, shared by every context, on the instance's device and stream
        self.cuda = CudaForwards.for_manifest(manifest, device_id, engine="TensorRT")
        self.device, self.stream = self.cuda.device, self.cuda.stream
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"TensorRT could not load {path} (see the TensorRT log above)")
        self.profile_table = profiles
        self.input_names = profiles.input_names
        check_io_contract(self._io_tensors(), self.output_name, self.input_names)
        if self.engine.num_optimization_profiles != len(profiles.profiles):
            raise RuntimeError(
                f"{path} has {self.engine.num_optimization_profiles} profiles; "
                f"the manifest describes {len(profiles.profiles)}"
            )

        # one activation block, shared by every context
        self.activation_bytes = int(self.engine.device_memory_size_v2)
        self.activations = torch.empty(
            max(self.activation_bytes, 1), dtype=torch.uint8, device=self.device
        )

        slots = context_slots(
            [p.captured_batch_sizes for p in profiles.buckets], profiles.long_rows is not None
        )
        self.profiles: list[_Profile] = []
        self.long_profile: _Profile | None = None
        for slot in slots:
            if slot.batch is None:
                self._add_profile(slot.profile)
            else:
                self._add_graph_context(self.profiles[slot.profile], slot.batch)
        self._capture_graphs()
        long_rows = profiles.long_rows
        if self.long_profile is not None and long_rows is not None:
            # warmed at its largest shape: it fits, and TensorRT has loaded what it needs
            self._forward_eagerly(self.long_profile.eager, *long_rows.max_shape)
        self.stream.synchronize()

    def _add_profile(self, index: int) -> None:
        eager = self._open_context(index, batch=None)
        if eager is None:
            raise RuntimeError(f"TensorRT could not create a context for profile {index}")
        entry = self.profile_table.profiles[index]
        profile = _Profile(index, entry.fixed_length, entry.max_rows, eager)
        if entry.fixed_length is None:
            self.long_profile = profile
        else:
            self.profiles.append(profile)

    def _add_graph_context(self, profile: _Profile, batch: int) -> None:
        """A context whose shape is [batch, bucket length] for good; where TensorRT refuses a
        second context on the profile, the graph shares the eager one (re-shaped at capture)."""
        context = self._open_context(profile.index, batch)
        if context is None:
            self._log(
                f"profile {profile.index} refuses another execution context; its batch-{batch} "
                "graph is captured on the profile's eager context, re-shaped for the capture"
            )
            context = _Context(profile.index, profile.eager.context, batch=None)
        profile.graphs[batch] = context

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

    def _open_context(self, index: int, batch: int | None) -> _Context | None:
        """A context on profile ``index`` bound to the shared buffers; None where TensorRT
        refuses one."""
        context = self.engine.create_execution_context(
            trt.ExecutionContextAllocationStrategy.USER_MANAGED
        )
        if context is None:
            return None
        context.set_device_memory(self.activations.data_ptr(), self.activation_bytes)
        try:  # the Python binding raises where the C++ API returns false
            if not context.set_optimization_profile_async(index, self.stream.cuda_stream):
                return None
        except RuntimeError:
            return None
        for name, buffer in self.cuda.inputs.items():
            context.set_tensor_address(name, buffer.data_ptr())
        context.set_tensor_address(self.output_name, self.cuda.out.data_ptr())
        return _Context(index, context, batch)

    def _set_shape(self, context: _Context, batch: int, length: int) -> None:
        for name in self.input_names:
            if not context.context.set_input_shape(name, trt.Dims2(batch, length)):
                raise RuntimeError(f"profile {context.profile} refuses shape [{batch}, {length}]")

    def _enqueue(self, context: _Context) -> None:
        if not context.context.execute_async_v3(self.stream.cuda_stream):
            raise RuntimeError(f"TensorRT forward failed on profile {context.profile}")

    def _eager_launch(self, context: _Context, batch: int, length: int) -> Callable[[], None]:
        """A forward at [batch, length] on a context re-shaped for it."""

        def launch() -> None:
            self._set_shape(context, batch, length)
            self._enqueue(context)

        return launch

    def _forward_eagerly(self, context: _Context, batch: int, length: int) -> None:
        """One forward of pad rows at [batch, length] without a graph: warm-up, or the check
        that a size whose capture failed still runs."""
        self.cuda.forward_pad_rows(batch, length, self._eager_launch(context, batch, length))

    def _capture_graphs(self) -> None:
        sizes = [(p.index, batch) for p in self.profiles for batch in p.graphs]
        graphs, failed = capture_all(sizes, self._capture, self._log)
        for (index, batch), graph in graphs.items():
            self.profiles[index].graphs[batch].graph = graph  # type: ignore[assignment]
        for index, batch in failed:
            profile = self.profiles[index]
            del profile.graphs[batch]  # that size now runs on the eager context
            profile.eager_sizes.add(batch)
            # the real check that it still runs, whatever error the failed capture left
            self._forward_eagerly(profile.eager, batch, profile.fixed_length or 1)

    def _capture(self, index: int, batch: int) -> Graph:
        """Captures one forward of bucket ``index`` at ``batch`` rows on that size's context."""
        profile = self.profiles[index]
        context = profile.graphs[batch]
        length = int(profile.fixed_length or 0)
        # the shape is set in the warm-up, once; the eager run first lets TensorRT finish lazy
        # allocations outside the capture
        return self.cuda.capture(
            batch,
            length,
            launch=lambda: self._enqueue(context),
            warm_up=self._eager_launch(context, batch, length),
        )

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
        """[B, T] int64 ids and mask -> [B, D] fp32, at the profile of length T: the graph of
        the next captured size, else the profile's eager context."""
        return self._run(input_ids, attention_mask, use_graph=True)

    def run_eagerly(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """``run`` at exactly B rows on the profile's eager context, never a graph (gpu_check's
        eager pass: a size without a graph really runs at that size)."""
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
        batch = rows
        if use_graph and profile.fixed_length:
            batch = self.layout.run_batch_size(length, rows)
        captured = profile.graphs.get(batch) if use_graph else None
        if captured is not None and captured.graph is not None:
            # replays the launches captured at this shape (in the fallback the shared eager
            # context may have been re-shaped since: the form Triton's TensorRT backend uses)
            return self.cuda.run(input_ids, attention_mask, batch, captured.graph.replay)
        launch = self._eager_launch(profile.eager, batch, length)
        return self.cuda.run(input_ids, attention_mask, batch, launch)

    def memory_bytes(self) -> dict[str, int]:
        """Device memory the engine holds, by what it is for (gpu_check prints it)."""
        return {"activations": self.activation_bytes, "io_buffers": self.cuda.io_bytes()}

    def num_contexts(self) -> int:
        """Execution contexts open, all on the one activation block (gpu_check prints it)."""
        profiles = [*self.profiles, *([self.long_profile] if self.long_profile else [])]
        own = [c for p in profiles for c in p.graphs.values() if c.batch is not None]
        return len(profiles) + len(own)

    def close(self) -> None:
        self.stream.synchronize()
        for profile in [*self.profiles, *([self.long_profile] if self.long_profile else [])]:
            profile.graphs.clear()
        self.profiles = []
        self.long_profile = None
