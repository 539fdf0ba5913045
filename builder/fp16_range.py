"""Float constants an ONNX graph holds beyond FP16's range, found before TensorRT builds it in FP16.

TensorRT converts an FP32 constant it runs in FP16 to FP16, and one beyond +-65504 becomes an
infinity there (it says so only in its log). Where such a constant is selected (``Where``) or
added, the infinity is what the graph meant: an attention mask's -3.4e38 becomes -inf, and softmax
takes it. Where it is multiplied, ``0 * inf`` is NaN and the output is garbage
(NVIDIA/TensorRT#1500, #2118): the old ``(mask - 1) * 1e9`` max pooling did exactly that. The
build lists every such constant with the operators that read it, and names those that multiply.

No TensorRT here: this reads the ONNX file only, so it is tested on every machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

FP16_MAX = 65504.0
# operators whose output is a product with the constant: an infinity there can meet a zero
MULTIPLYING_OPS = frozenset({"Mul", "MatMul", "Gemm", "Einsum", "Pow"})


@dataclass(frozen=True)
class OutOfRangeConstant:
    """One float constant with a value FP16 cannot hold."""

    name: str  # the initializer's or Constant node's output name
    largest: float  # the value of largest magnitude in it
    consumers: tuple[str, ...]  # operator types that read it

    @property
    def multiplied(self) -> bool:
        """An infinity here can be multiplied by zero (NaN), not only selected or added."""
        return bool(MULTIPLYING_OPS.intersection(self.consumers))

    def describe(self) -> str:
        risk = "multiplied: NaN risk in FP16" if self.multiplied else "becomes an infinity in FP16"
        readers = ", ".join(self.consumers) or "no operator"
        return f"{self.name} = {self.largest:.3g}, read by {readers}: {risk}"


def _beyond_fp16(array: np.ndarray) -> float | None:
    """The largest-magnitude value of a float array beyond FP16's range, if any; in an FP16
    array (a graph exported in FP16), an infinity: a value the export's cast overflowed."""
    if array.dtype.kind != "f" or array.size == 0:
        return None  # integers never run in FP16
    flat = array.ravel().astype(np.float64)
    out = np.abs(flat) > FP16_MAX  # infinities included
    if not out.any():
        return None
    values = flat[out]
    return float(values[np.argmax(np.abs(values))])


def constants_beyond_fp16(onnx_path: Path) -> list[OutOfRangeConstant]:
    """Every float initializer and Constant / ConstantOfShape value of the graph (subgraphs of
    control-flow nodes too) that FP16 cannot hold, in graph order."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(onnx_path))
    found: list[OutOfRangeConstant] = []

    def scan(graph: onnx.GraphProto) -> None:
        readers: dict[str, list[str]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node.op_type)

        def check(name: str, array: np.ndarray) -> None:
            largest = _beyond_fp16(array)
            if largest is not None:
                found.append(OutOfRangeConstant(name, largest, tuple(readers.get(name, ()))))

        for initializer in graph.initializer:
            check(initializer.name, numpy_helper.to_array(initializer))
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.TENSOR and node.op_type in (
                    "Constant",
                    "ConstantOfShape",
                ):
                    check(node.output[0], numpy_helper.to_array(attribute.t))
                elif attribute.type == onnx.AttributeProto.GRAPH:
                    scan(attribute.g)

    scan(model.graph)
    return found
