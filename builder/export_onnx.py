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

OPSET = 17
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


class FP32Norm(nn.Module):
    """A norm computing in FP32 inside a lower-precision graph: its input cast up, its output
    back (a row's mean of squares overflows FP16 long before its values do)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm.to(torch.float32)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden.to(torch.float32)).to(hidden.dtype)


def is_norm(module: nn.Module) -> bool:
    return isinstance(module, nn.LayerNorm) or type(module).__name__.endswith("RMSNorm")


def in_precision(module: nn.Module, precision: str) -> nn.Module:
    """A copy of ``module`` in ``precision`` with every norm in FP32 (``FP32Norm``)."""
    if precision == "fp32":
        return module
    lowered = copy.deepcopy(module).to(DTYPES[precision])
    for parent in list(lowered.modules()):
        for name, child in list(parent.named_children()):
            if is_norm(child):
                setattr(parent, name, FP32Norm(child))
    return lowered


def export_onnx(
    model: LoadedModel, path: Path, sample_length: int = 16, precision: str = "fp32"
) -> Path:
    """Writes ``path``: inputs input_ids, attention_mask (and token_type_ids for pair models)
    [B, T] int64; output [B, D] fp32; computed in ``precision`` (``in_precision``)."""
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
            in_precision(model.module, precision),
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
