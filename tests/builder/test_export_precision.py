"""The ONNX a strongly typed TensorRT network is built from: exported in FP16 with every norm,
the pooling and the output in FP32, and still the model's answers (ONNX Runtime runs the FP16
graph on the CPU, against the FP32 module)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builder.export_onnx import export_onnx, lowered
from builder.families import load_model

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
torch = pytest.importorskip("torch")

FLOAT, FLOAT16 = 1, 10  # onnx.TensorProto's element types


@pytest.mark.parametrize("which", ["minilm", "decoder"])
def test_an_fp16_export_keeps_norms_pooling_and_output_in_fp32(
    which, minilm_dir, tiny_decoder_dir, tmp_path
):
    model_dir = minilm_dir if which == "minilm" else tiny_decoder_dir
    model = load_model(
        Path(model_dir), score_token_ids=[2023, 2025] if which == "decoder" else None
    )
    copy = lowered(model.module, "fp16")
    dtypes = {p.dtype for name, p in copy.named_parameters() if ".norm." not in f".{name}."}
    assert dtypes == {torch.float16}
    assert {p.dtype for name, p in copy.named_parameters() if ".norm." in f".{name}."} == {
        torch.float32
    }
    rotary = {b.dtype for name, b in copy.named_buffers() if name.endswith("inv_freq")}
    assert rotary <= {torch.float32} and (rotary or which == "minilm")
    assert model.module.training is False and next(model.module.parameters()).dtype == torch.float32
    path = export_onnx(model, tmp_path / "model.onnx", precision="fp16")
    graph = onnx.load(str(path)).graph
    kinds = {i.data_type for i in graph.initializer if i.dims}
    assert FLOAT16 in kinds and graph.output[0].type.tensor_type.elem_type == FLOAT
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 29000, (4, 24)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 12:] = 0
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
    with torch.no_grad():
        want = model.module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert np.isfinite(got).all() and cosine.min() >= 0.999, cosine
