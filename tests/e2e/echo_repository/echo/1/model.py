"""Answers, as one JSON string, what Triton read of each request: every input present with its
shape and values, and the request's parameters. A test model only."""

import json

import numpy as np
import triton_python_backend_utils as pb_utils

INPUTS = ("X", "F", "T")


def value(item):
    return item.decode("utf-8", "backslashreplace") if isinstance(item, bytes) else item


def seen(request) -> str:
    inputs = {}
    for name in INPUTS:
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is not None:
            array = tensor.as_numpy()
            values = [value(v) for v in array.ravel().tolist()]
            inputs[name] = {"shape": list(array.shape), "data": values}
    return json.dumps({"inputs": inputs, "parameters": json.loads(request.parameters() or "{}")})


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("SEEN", np.array([seen(r).encode()], dtype=object))]
            )
            for r in requests
        ]
