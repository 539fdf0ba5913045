"""The precision a build runs in: what each engine kind can run, the default by architecture, the
advice a refusal names, and which layers of an FP16 TensorRT network stay in FP32.

Defaults (``default_precision``), unless ``--precision`` says otherwise:

| architecture | TensorRT | torch on a GPU | torch without one, ONNX Runtime |
|---|---|---|---|
| encoder (BERT-like) | fp16 | fp16 | fp32 |
| decoder (Qwen, Llama, ...) | fp32 | bf16; fp32 where the GPU lacks BF16 | fp32 |

Decoders are trained in BF16, whose range is FP32's: their activations (the residual stream,
attention's outliers) pass FP16's largest value, 65504, and an FP16 engine answers inf or NaN.
BF16 keeps the range at FP16's speed where the GPU has it (compute capability 8.0 and later);
TensorRT here builds weakly typed FP16 or FP32 networks, so decoders build FP32 there.

Pooling and L2 normalisation run in FP32 in every precision (``torch_modules.Pooling``): in the
graph they are the nodes under ``FP32_SCOPES``, which ``fp32_layers`` picks out of a TensorRT
network for precision constraints.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from builder.spec import BuildError
from python_backend.common.manifest import ENGINE_PRECISIONS
from python_backend.engines.torch_modules import FP32_SCOPES

ENGINE_NAMES = {"onnxruntime": "ONNX Runtime", "tensorrt": "TensorRT", "torch": "torch"}


def default_precision(engine_kind: str, decoder: bool, gpu: bool, bf16: bool) -> str:
    """The precision a build runs in when ``--precision`` is not given (the table above):
    ``decoder``: the model is a decoder architecture; ``gpu``: the torch engine will run on a
    CUDA GPU; ``bf16``: that GPU computes BF16 natively."""
    if engine_kind == "tensorrt":
        return "fp32" if decoder else "fp16"
    if engine_kind != "torch" or not gpu:
        return "fp32"
    if decoder:
        return "bf16" if bf16 else "fp32"
    return "fp16"


# who runs a precision beyond fp32, for the message refusing it elsewhere
RUN_BY = {"fp16": "TensorRT and torch", "bf16": "the torch engine on a GPU with BF16"}


def check_precision(engine_kind: str, precision: str, gpu: bool, bf16: bool) -> None:
    """A BuildError, naming what to ask for instead, where the engine cannot run ``precision``
    here (``gpu``, ``bf16``: as for ``default_precision``)."""
    if precision not in ENGINE_PRECISIONS[engine_kind]:
        raise BuildError(
            f"--precision {precision} is for {RUN_BY[precision]}; {ENGINE_NAMES[engine_kind]} "
            f"engines run {', '.join(ENGINE_PRECISIONS[engine_kind])}"
        )
    if engine_kind == "torch" and precision != "fp32" and not gpu:
        raise BuildError(
            f"--engine torch --precision {precision} runs on a CUDA GPU and none is visible; "
            "--precision fp32 builds it for the CPU"
        )
    if engine_kind == "torch" and precision == "bf16" and not bf16:
        raise BuildError(
            "--precision bf16: this GPU does not compute BF16 natively (compute capability 8.0 "
            "and later do); build with --precision fp32 (or fp16 for an encoder)"
        )


def precision_fix(engine_kind: str, precision: str, bf16: bool) -> str:
    """What to build with instead when an engine in ``precision`` answers non-finite or wrong
    outputs (``bf16``: the GPU computes BF16 natively)."""
    if precision == "fp16":
        instead = "--precision fp32"
        if engine_kind == "torch" and bf16:
            instead = "--precision bf16 (FP32's range at FP16's speed) or --precision fp32"
        return (
            "FP16's range (its largest value is 65504) is too small for this model's activations, "
            f"as for decoders trained in BF16: build with {instead}"
        )
    if precision == "bf16":
        return "BF16's 8 bits of precision are too few for this model: build with --precision fp32"
    return (
        "the engine does not compute what the model does in FP32 itself, so no precision fixes "
        "it: report it with the model"
    )


def in_fp32_scope(layer_name: str) -> bool:
    """Whether a layer of the network (named after its ONNX node, ``/pool/ReduceSum``) is one
    of the wrapper's FP32 submodules."""
    return any(layer_name.startswith(f"/{scope}/") for scope in FP32_SCOPES)


def fp32_layers(network: Any, float32: Any) -> Iterator[Any]:
    """The layers of a TensorRT network (``INetworkDefinition``) to constrain to FP32: those of
    the FP32 scopes that take and give float tensors only (not the casts of the integer mask, nor
    the shape and index arithmetic beside them). ``float32``: TensorRT's ``DataType.FLOAT``."""
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        if not in_fp32_scope(layer.name):
            continue
        inputs = [layer.get_input(j) for j in range(layer.num_inputs)]
        outputs = [layer.get_output(j) for j in range(layer.num_outputs)]
        tensors = [t for t in (*inputs, *outputs) if t is not None]
        if outputs and all(t.dtype == float32 for t in tensors):
            yield layer
