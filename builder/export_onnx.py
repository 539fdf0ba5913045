"""Exports a wrapped model to ONNX with dynamic batch and sequence axes, in FP32, or with its
precision in the graph itself for a strongly typed TensorRT network: FP16 weights and
activations, every norm computing in FP32 between casts, pooling and normalisation in FP32 (the
wrappers cast there themselves, ``torch_modules.FP32_SCOPES``), the output FP32."""

from __future__ import annotations

import copy
import warnings
from pathlib import Path

import torch
from torch import nn

from builder.families import LoadedModel
from python_backend.engines.torch_modules import DTYPES, in_precision

OPSET = 17


def lowered(module: nn.Module, precision: str) -> nn.Module:
    """A copy of ``module`` in ``precision`` (``torch_modules.in_precision``: norms and rotary
    frequencies in FP32); the module itself where that is FP32."""
    if precision == "fp32":
        return module
    return in_precision(copy.deepcopy(module), DTYPES[precision])


def export_onnx(
    model: LoadedModel, path: Path, sample_length: int = 16, precision: str = "fp32"
) -> Path:
    """Writes ``path``: inputs input_ids, attention_mask (and token_type_ids for pair models)
    [B, T] int64; output [B, D] fp32; computed in ``precision`` (``lowered``)."""
    ids = torch.ones((2, sample_length), dtype=torch.long)
    mask = torch.ones((2, sample_length), dtype=torch.long)
    mask[1, sample_length // 2 :] = 0  # a padded row in the trace keeps mask paths general
    sample: tuple[torch.Tensor, ...] = (ids, mask)
    if len(model.input_names) == 3:
        types = torch.zeros((2, sample_length), dtype=torch.long)
        types[:, sample_length // 4 :] = 1  # the second text's tokens
        sample = (ids, mask, types)
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about python control flow on shapes
        torch.onnx.export(
            lowered(model.module, precision),
            sample,
            str(path),
            input_names=list(model.input_names),
            output_names=[model.output_name],
            dynamic_axes={
                **{name: {0: "batch", 1: "sequence"} for name in model.input_names},
                model.output_name: {0: "batch"},
            },
            opset_version=OPSET,
            dynamo=False,
        )
    return path
