"""What the GPU engines share: the instance's device and stream, the I/O buffers every forward
uses, pad rows, and CUDA-graph capture with its fallback. The TensorRT engine and the torch engine
both run through one ``CudaForwards``; each brings only how it launches a forward.

- Device: the one Triton names for the model instance. Every call makes it current on the calling
  thread first: a thread starts on GPU 0, and entering a stream of another device from there would
  create a context on GPU 0 and switch devices on every forward.
- Stream: the instance's own; every forward, warm-up and capture runs on it, one after another.
- Buffers: one flat device buffer per graph input, sized for the largest forward, with a pinned
  host buffer beside each, so host-device copies are asynchronous DMA; one output buffer and its
  pinned host copy. A graph reads its inputs from these buffers and writes its answer into the
  output buffer, so a replay needs no new addresses.
- Pad rows: a group of B rows runs at the next captured size >= B; the rows past the real ones
  hold one real token each (so pooling never divides by zero) and are dropped.
- Capture: one warm eager forward first (lazy allocations, kernel choice, then outside the
  capture), then ``torch.cuda.graph`` in thread-local mode (another thread's CUDA calls cannot
  invalidate it), every graph in one memory pool: forwards run one at a time on one stream, so
  graphs never need their intermediates at the same time. A size that cannot be captured is
  logged and runs eagerly (``capture_all``) instead of failing the model load; the caller checks
  that it still runs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import numpy as np
import torch

from python_backend.common.contract import ENGINE_INPUTS, TOKEN_TYPE_INPUT
from python_backend.common.manifest import Manifest
from python_backend.engines.base import graph_inputs

Graph = torch.cuda.CUDAGraph  # one captured forward; ``replay`` runs it again

# a row past the real ones, per graph input: (its first token, the rest)
_PAD_ROW_INPUTS = {ENGINE_INPUTS[1]: (1, 0), TOKEN_TYPE_INPUT: (0, 0)}


def capture_all(
    sizes: Iterable[tuple[int, int]],
    capture: Callable[[int, int], object],
    log: Callable[[str], None],
) -> tuple[dict[tuple[int, int], object], list[tuple[int, int]]]:
    """Captures every (bucket, batch); returns the graphs and the sizes left to run eagerly.

    ``capture`` raises when a size cannot be captured, after ending the capture and clearing
    the CUDA error it left; that size then runs eagerly (the caller checks it still runs).
    """
    graphs: dict[tuple[int, int], object] = {}
    eager: list[tuple[int, int]] = []
    for bucket, batch in sizes:
        try:
            graphs[(bucket, batch)] = capture(bucket, batch)
        except Exception as err:
            eager.append((bucket, batch))
            log(
                f"bucket {bucket}, batch {batch}: CUDA-graph capture failed ({err}); "
                "that size runs without a graph"
            )
    return graphs, eager


class CudaForwards:
    """One engine's device, stream and I/O buffers; runs and captures forwards on them."""

    def __init__(
        self,
        device_id: int,
        input_names: Sequence[str],
        pad_token_id: int,
        max_tokens: int,
        max_rows: int,
        output_dim: int,
        engine: str,
    ) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"the manifest names a {engine} engine, but no CUDA device is visible"
            )
        self.device = torch.device("cuda", device_id)
        torch.cuda.set_device(self.device)  # engines allocate on the current device
        self.stream = torch.cuda.Stream(device=self.device)
        # a forward is waited for on this event: with blocking sync the waiting thread sleeps
        # until the GPU is done; a stream's synchronize spins a core meanwhile (CUDA's default
        # schedule, while contexts <= cores), the core a pinned owner shares with its I/O
        self.done = torch.cuda.Event(blocking=True)
        self.pool = torch.cuda.graph_pool_handle()
        self.input_names = tuple(input_names)
        self.inputs = {
            name: torch.zeros(max_tokens, dtype=torch.int64, device=self.device)
            for name in self.input_names
        }
        self.host_inputs = {
            name: torch.empty(max_tokens, dtype=torch.int64, pin_memory=True)
            for name in self.input_names
        }
        pad_rows = {ENGINE_INPUTS[0]: (pad_token_id, pad_token_id), **_PAD_ROW_INPUTS}
        self._pad_row = {name: pad_rows[name] for name in self.input_names}
        self.out = torch.empty((max_rows, output_dim), dtype=torch.float32, device=self.device)
        self.host_out = torch.empty((max_rows, output_dim), dtype=torch.float32, pin_memory=True)

    @classmethod
    def for_manifest(cls, manifest: Manifest, device_id: int, engine: str) -> CudaForwards:
        """Buffers for every forward the manifest's profiles take, on GPU ``device_id``."""
        profiles = manifest.engine_profiles
        return cls(
            device_id,
            profiles.input_names,
            manifest.pad_token_id,
            profiles.max_tokens,
            profiles.max_rows,
            manifest.output_dim,
            engine,
        )

    def on_device(self) -> None:
        """Makes the engine's GPU current on the calling thread (each thread starts on GPU 0)."""
        if torch.cuda.current_device() != self.device.index:
            torch.cuda.set_device(self.device)

    def input_views(self, batch: int, length: int) -> list[torch.Tensor]:
        """The graph inputs of a [batch, length] forward, in ``input_names`` order: views of
        the shared buffers, so a graph captured on them reads whatever is staged there."""
        count = batch * length
        return [self.inputs[name][:count].view(batch, length) for name in self.input_names]

    def fill_pad_rows(self, start_row: int, count: int, length: int) -> None:
        """Rows ``start_row`` .. + ``count`` of a [*, length] forward become pad rows (on the
        stream: the caller is inside it)."""
        first, end = start_row * length, (start_row + count) * length
        for name, (first_token, rest) in self._pad_row.items():
            rows = self.inputs[name][first:end].view(count, length)
            rows.fill_(rest)
            rows[:, 0] = first_token

    def forward_pad_rows(self, batch: int, length: int, launch: Callable[[], None]) -> None:
        """One forward of pad rows at [batch, length], waited for: a warm-up, or the check
        that a size whose capture failed still runs."""
        self.on_device()
        with torch.cuda.stream(self.stream):
            self.fill_pad_rows(0, batch, length)
            launch()
        self.stream.synchronize()

    def capture(
        self,
        batch: int,
        length: int,
        launch: Callable[[], None],
        warm_up: Callable[[], None] | None = None,
    ) -> Graph:
        """A graph of ``launch`` at [batch, length], after one eager forward (``warm_up``,
        default ``launch`` itself) of pad rows at that shape."""
        self.forward_pad_rows(batch, length, warm_up or launch)
        graph = Graph()
        with torch.cuda.graph(
            graph, pool=self.pool, stream=self.stream, capture_error_mode="thread_local"
        ):
            launch()
        return graph

    def run(
        self,
        input_ids: np.ndarray,
        attention_mask: np.ndarray,
        batch: int,
        launch: Callable[[], None],
    ) -> np.ndarray:
        """Stages the rows, makes rows up to ``batch`` pad rows, ``launch``es the forward (a
        graph replay or an eager forward, which writes ``out``) and returns the real rows."""
        rows, length = input_ids.shape
        n_real = rows * length
        tensors = graph_inputs(input_ids, attention_mask)
        for name in self.input_names:
            self.host_inputs[name][:n_real].numpy()[:] = tensors[name].reshape(-1)
        self.on_device()
        with torch.cuda.stream(self.stream):
            for name in self.input_names:
                host = self.host_inputs[name][:n_real]
                self.inputs[name][:n_real].copy_(host, non_blocking=True)
            if batch > rows:
                self.fill_pad_rows(rows, batch - rows, length)
            launch()
            self.host_out[:rows].copy_(self.out[:rows], non_blocking=True)  # one D2H copy
            self.done.record(self.stream)
        self.done.synchronize()
        return self.host_out[:rows].numpy().copy()

    def io_bytes(self) -> int:
        """Device memory of the I/O buffers."""
        return sum(buffer.numel() * 8 for buffer in self.inputs.values()) + self.out.numel() * 4

    def synchronize(self) -> None:
        self.stream.synchronize()
