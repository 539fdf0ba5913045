"""ONNX -> one TensorRT engine with one optimization profile per entry of the manifest's
``engine_profiles`` (one per length bucket, then the long-row profile), in that order.

Each bucket's profile fixes the sequence length (min = opt = max = the bucket length), so kernels
are tuned for exactly that shape, and lets the batch run from 1 to the bucket's max rows with opt
at the batch the planner really runs there (``builder.opt_shapes``). An optional last profile takes rows between the last bucket and the max length
at their exact length. A timing cache file is reused across builds: rebuilding after a bucket
change re-times only new shapes.

A weakly typed network (TensorRT 10's default here) runs FP16 where ``BuilderFlag.FP16`` lets
it; the pooling and L2 normalisation stay in FP32: their layers (the graph's nodes under
``torch_modules.FP32_SCOPES``, ``builder.precision.fp32_layers``) are constrained to FP32
computation and FP32 outputs, and the builder obeys the constraints (a build that cannot fails
instead of falling back): a mean over a long row of FP16 hidden states would overflow FP16. A
strongly typed network (TensorRT 11's only form; ``--strongly-typed`` on 10) takes every
tensor's type from the ONNX, which the export writes in the engine's precision with norms,
pooling and normalisation in FP32 (``builder.export_onnx``).

TensorRT only exists on GPU nodes (NVIDIA's containers); this module is type-checked against the
TensorRT 10.13 stubs everywhere and run on the node.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import tensorrt as trt

from builder.precision import fp32_layers
from builder.timing_cache import save_timing_cache, use_timing_cache, write_atomically
from python_backend.common.engine_profiles import EngineProfiles

WORKSPACE_BYTES = 8 << 30


def keep_pooling_in_fp32(network: trt.INetworkDefinition) -> int:
    """Constrains the pooling and normalisation layers to compute and output FP32 (TensorRT 10's
    per-layer precision of weakly typed networks); returns how many layers were constrained."""
    pinned = 0
    for layer in fp32_layers(network, trt.float32):
        layer.precision = trt.float32
        for i in range(layer.num_outputs):
            layer.set_output_type(i, trt.float32)
        pinned += 1
    return pinned


def build_engine(
    onnx_path: Path,
    engine_path: Path,
    profiles: EngineProfiles,
    precision: str,
    timing_cache_path: Path,
    log: Callable[[str], None] = print,
    timing_cache_fallback: Path | None = None,
    strongly_typed: bool = False,
) -> str:
    """Builds and writes the serialized engine; returns the TensorRT version that built it.
    The timing cache goes to ``timing_cache_fallback`` where its own path is not writable."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    # explicit batch is the only mode since TensorRT 10; strongly typed: types from the ONNX
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if strongly_typed else 0
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"TensorRT could not parse {onnx_path}: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, WORKSPACE_BYTES)
    if precision == "fp16" and not strongly_typed:
        config.set_flag(trt.BuilderFlag.FP16)
        pinned = keep_pooling_in_fp32(network)
        if pinned:
            config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
            log(f"{pinned} pooling and normalisation layers constrained to FP32")
    use_timing_cache(config, timing_cache_path, log)

    # every graph input takes the same [B, T] range: ids, mask, and token types for pair models
    graph_inputs = tuple(network.get_input(i).name for i in range(network.num_inputs))
    if graph_inputs != profiles.input_names:
        raise RuntimeError(
            f"{onnx_path} has inputs {list(graph_inputs)}; the manifest names "
            f"{list(profiles.input_names)}"
        )
    for entry in profiles.profiles:
        profile = builder.create_optimization_profile()
        for name in profiles.input_names:
            profile.set_shape(
                name,
                trt.Dims2(*entry.min_shape),
                trt.Dims2(*entry.opt_shape),
                trt.Dims2(*entry.max_shape),
            )
        config.add_optimization_profile(profile)
    typing = "strongly typed" if strongly_typed else "weakly typed"
    log(f"building TensorRT engine: {len(profiles.profiles)} profiles, {precision}, {typing}")

    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError("TensorRT engine build failed (see the TensorRT log above)")
    write_atomically(engine_path, memoryview(serialized))  # TensorRT's buffer, not a copy
    save_timing_cache(config, timing_cache_path, log, timing_cache_fallback)
    return str(trt.__version__)
