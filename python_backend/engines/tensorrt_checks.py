"""What the TensorRT engine checks and decides at load, kept free of TensorRT and CUDA imports so
that every rule here is unit-tested on machines without a GPU.

- ``require_built_by``: a plan loads only in the TensorRT version that serialized it (plans are
  not built version-compatible), so a mismatch is refused with both versions named, before
  TensorRT's own deserializer fails with a less helpful message;
- ``check_io_contract``: the engine's I/O tensors are exactly the manifest's INT64 [B, T] inputs
  and the FP32 [B, D] output the runtime binds; anything else is named;
- ``require_supported_major``: a build or load under a TensorRT major the project has not been
  checked on is refused, saying what moving the image to it takes; ``strongly_typed``: which
  network form a build takes (TensorRT 11 dropped weakly typed networks, ``BuilderFlag.FP16``;
  strongly typed ones, their precision exported into the ONNX, exist in 10 too);
- ``context_slots``: which execution contexts the engine opens: one per (profile, captured batch
  size), its shape set once and never changed, and one eager context per profile that is
  re-shaped for every other size (TensorRT's guidance for CUDA graphs: a graph replays the
  context's state at capture, so a context that is re-shaped later must not own a graph).

Capture itself, and its fallback, is shared with the torch engine (``cuda_graphs``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from python_backend.common.contract import ENGINE_INPUTS


class EngineContractError(RuntimeError):
    """The engine file does not match what the manifest and the runtime expect."""


def require_built_by(built: str, running: str, path: object) -> None:
    """Refuses a plan built by another TensorRT version (``built`` comes from the manifest)."""
    if not built:
        raise EngineContractError(
            f"the manifest of {path} does not record the TensorRT version that built it; "
            f"rebuild it with TensorRT {running}"
        )
    if built != running:
        raise EngineContractError(
            f"{path} was built by TensorRT {built}, and this server runs TensorRT {running}: a "
            "plan loads only in the version that built it. Rebuild the engine in this image "
            "(python -m builder build --engine tensorrt)"
        )


# the TensorRT majors this project builds and loads plans with, checked on a GPU
SUPPORTED_TENSORRT_MAJORS = (10,)
# from this major on, TensorRT builds strongly typed networks only
STRONGLY_TYPED_FROM_MAJOR = 11


def major_of(version: str) -> int:
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else 0


def strongly_typed(running: str, asked: bool) -> bool:
    """Whether a build is strongly typed: where the TensorRT has no other form, or asked."""
    return asked or major_of(running) >= STRONGLY_TYPED_FROM_MAJOR


def require_supported_major(running: str) -> None:
    """Refuses a TensorRT whose major the builder and runtime have not been checked on, saying
    what an image with it needs."""
    if major_of(running) not in SUPPORTED_TENSORRT_MAJORS:
        checked = ", ".join(f"{m}.x" for m in SUPPORTED_TENSORRT_MAJORS)
        raise EngineContractError(
            f"TensorRT {running} is not supported: this project builds and loads plans with "
            f"TensorRT {checked}. The builder is ready for TensorRT {STRONGLY_TYPED_FROM_MAJOR}: "
            "its networks are strongly typed, their precision exported into the ONNX, as "
            "--strongly-typed builds them on 10. To move the image, set TENSORRT_VERSION in "
            "docker-compose.yml's release block, run python -m builder.gpu_check in it, and add "
            "its major to SUPPORTED_TENSORRT_MAJORS (python_backend/engines/tensorrt_checks.py) "
            "once it passes"
        )


@dataclass(frozen=True)
class ContextSlot:
    """One execution context of the engine, all of them on one shared activation block."""

    profile: int  # the optimization profile it is bound to
    batch: int | None  # the captured batch size (shape fixed at load); None: the eager context


def context_slots(captured_sizes: Sequence[Sequence[int]], long_rows: bool) -> list[ContextSlot]:
    """The contexts to open, in order: per bucket profile its eager context, then one per captured
    size; the long-row profile (last, if any) only an eager one (its lengths vary)."""
    slots: list[ContextSlot] = []
    for profile, sizes in enumerate(captured_sizes):
        slots.append(ContextSlot(profile, None))
        slots.extend(ContextSlot(profile, batch) for batch in sizes)
    if long_rows:
        slots.append(ContextSlot(len(captured_sizes), None))
    return slots


@dataclass(frozen=True)
class IOTensor:
    """One engine I/O tensor as TensorRT describes it, in plain values."""

    name: str
    is_input: bool
    dtype: str  # TensorRT's DataType name: INT64, FLOAT, HALF, ...
    rank: int


def check_io_contract(
    tensors: Iterable[IOTensor], output_name: str, input_names: Sequence[str] = ENGINE_INPUTS
) -> None:
    """The runtime binds every name of ``input_names`` (the manifest's: ids, mask, and token
    types for pair models) as INT64 [B, T] and the output as FLOAT [B, D]."""
    expected = {name: (True, "INT64") for name in input_names}
    expected[output_name] = (False, "FLOAT")
    seen: set[str] = set()
    for tensor in tensors:
        if tensor.name not in expected:
            kind = "input" if tensor.is_input else "output"
            raise EngineContractError(
                f"engine {kind} tensor '{tensor.name}' is not one the runtime binds "
                f"(expected {sorted(expected)})"
            )
        is_input, dtype = expected[tensor.name]
        if tensor.is_input != is_input:
            want = "an input" if is_input else "an output"
            raise EngineContractError(f"engine tensor '{tensor.name}' must be {want}")
        if tensor.dtype != dtype:
            raise EngineContractError(
                f"engine tensor '{tensor.name}' is {tensor.dtype}; the runtime binds {dtype}"
            )
        if tensor.rank != 2:
            raise EngineContractError(
                f"engine tensor '{tensor.name}' has rank {tensor.rank}; the runtime binds rank 2"
            )
        seen.add(tensor.name)
    missing = sorted(set(expected) - seen)
    if missing:
        raise EngineContractError(f"engine tensor '{missing[0]}' is missing from the engine")
