"""Exports a wrapped model to ONNX with dynamic batch and sequence axes."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from builder.families import LoadedModel

OPSET = 17


def export_onnx(model: LoadedModel, path: Path, sample_length: int = 16) -> Path:
    """Writes ``path``: inputs input_ids, attention_mask (and token_type_ids for pair models)
    [B, T] int64; output [B, D] fp32."""
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
            model.module,
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
