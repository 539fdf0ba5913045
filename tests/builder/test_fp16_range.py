"""Constants beyond FP16's range in the exported graphs: every pooling the builder exports keeps
its own masks finite, the transformer's own masks are selected (never multiplied), and a graph
that multiplies such a constant is caught."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from transformers import AutoModel

from builder.build import Progress, check_fp16_range
from builder.export_onnx import export_onnx
from builder.families import POOLING_MODES, EmbeddingHead, load_model
from builder.fp16_range import FP16_MAX, constants_beyond_fp16
from builder.spec import BuildError


class OldMaxPooling(EmbeddingHead):
    """Max pooling as it was: padding pushed down by multiplying the mask with 1e9."""

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden + (mask - 1.0) * 1e9).max(dim=1).values


def export(tmp_path, classifier_dir, head_class, pooling):
    loaded = load_model(classifier_dir)
    head = head_class(AutoModel.from_pretrained(classifier_dir), pooling, normalize=True).eval()
    model = replace(loaded, module=head, family="embedding", output_name="EMBEDDING")
    return export_onnx(model, tmp_path / f"{head_class.__name__}-{pooling}.onnx"), head


@pytest.mark.parametrize("pooling", POOLING_MODES)
def test_exported_poolings_multiply_no_constant_fp16_cannot_hold(
    tmp_path, tiny_classifier_dir, pooling
):
    path, _ = export(tmp_path, tiny_classifier_dir, EmbeddingHead, pooling)
    found = constants_beyond_fp16(path)
    # what is left is the transformer's own attention mask (float32's lowest, selected by Where):
    # an infinity in FP16, which softmax takes
    assert found, "the scan no longer sees transformers' attention mask"
    assert all(not c.multiplied and set(c.consumers) <= {"Where"} for c in found), found
    assert all(abs(c.largest) > FP16_MAX for c in found)


def test_a_multiplied_out_of_range_constant_is_named(tmp_path, tiny_classifier_dir):
    path, _ = export(tmp_path, tiny_classifier_dir, OldMaxPooling, "max")
    multiplied = [c for c in constants_beyond_fp16(path) if c.multiplied]
    assert [c.largest for c in multiplied] == [1e9]
    assert "NaN risk" in multiplied[0].describe()
    # a TensorRT FP16 build refuses it, naming the fix
    with pytest.raises(BuildError, match="--precision fp32"):
        check_fp16_range(path, Progress(1, quiet=True))
    clean, _ = export(tmp_path, tiny_classifier_dir, EmbeddingHead, "max")
    check_fp16_range(clean, Progress(1, quiet=True))  # the mask's Where is reported, not refused


def test_max_pooling_with_a_finite_fill_equals_the_old_form_in_fp32(tiny_classifier_dir):
    encoder = AutoModel.from_pretrained(tiny_classifier_dir).eval()
    new = EmbeddingHead(encoder, "max", normalize=False)
    old = OldMaxPooling(encoder, "max", normalize=False)
    ids = torch.randint(1000, 29000, (3, 12))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    mask[2, 1:] = 0
    with torch.no_grad():
        assert np.array_equal(new(ids, mask).numpy(), old(ids, mask).numpy())


def test_an_infinity_in_an_fp16_graph_is_named(tmp_path):
    """A graph exported in FP16 (a strongly typed TensorRT build's) holds FP16 constants: one
    the cast overflowed to infinity is reported, and named when multiplied."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from builder.fp16_range import constants_beyond_fp16

    weight = np.array([[1.0, np.inf], [2.0, 3.0]], dtype=np.float16)
    fine = np.array([1.0, 2.0], dtype=np.float16)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Add", ["y", "b"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, 2])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT16, [1, 2])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(fine, "b")],
    )
    path = tmp_path / "fp16.onnx"
    onnx.save(helper.make_model(graph), str(path))
    (found,) = constants_beyond_fp16(path)
    assert found.name == "w" and np.isinf(found.largest) and found.multiplied
