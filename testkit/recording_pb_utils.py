"""A recording stand-in for Triton's Python-backend utilities (unit tests only)."""

from __future__ import annotations

import threading

import numpy as np


class RecordingPbUtils:
    """A stand-in for ``triton_python_backend_utils`` that records what the model does with it:
    metric calls, log lines, and the responses it sends (unit tests only; the real module exists
    only inside Triton's Python-backend stub)."""

    TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.warnings: list[str] = []
        self.infos: list[str] = []
        self.errors: list[str] = []
        recorder = self

        class Metric:
            def __init__(self, family: str, labels: dict) -> None:
                self.key = (family, tuple(sorted(labels.items())))

            def _record(self, op: str, value) -> None:
                if fail:
                    raise RuntimeError("metric family deleted")
                recorder.calls.append((op, *self.key, value))

            def increment(self, value) -> None:
                self._record("increment", value)

            def set(self, value) -> None:
                self._record("set", value)

            def observe(self, value) -> None:
                self._record("observe", value)

        class MetricFamily:
            COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"

            def __init__(self, name: str, description: str, kind: str) -> None:
                self.name = name

            def Metric(self, labels: dict, buckets=None) -> Metric:  # Triton's name for it
                return Metric(self.name, labels)

        class Logger:
            @staticmethod
            def log_warn(message: str) -> None:
                recorder.warnings.append(message)

            @staticmethod
            def log_info(message: str) -> None:
                recorder.infos.append(message)

            @staticmethod
            def log_error(message: str) -> None:
                recorder.errors.append(message)

        self.MetricFamily = MetricFamily
        self.Logger = Logger
        self.TritonError = TritonError
        self.InferenceResponse = InferenceResponse
        self.Tensor = Tensor

    @staticmethod
    def get_input_tensor_by_name(request: FakeRequest, name: str) -> Tensor | None:
        array = request.inputs.get(name)
        return None if array is None else Tensor(name, array)


class TritonError:
    INVALID_ARG, UNAVAILABLE, CANCELLED, INTERNAL = (
        "INVALID_ARG",
        "UNAVAILABLE",
        "CANCELLED",
        "INTERNAL",
    )

    def __init__(self, message: str, code: str = "INTERNAL") -> None:
        self.message, self.code = message, code


class Tensor:
    def __init__(self, name: str, array: np.ndarray) -> None:
        self.name, self.array = name, array

    def as_numpy(self) -> np.ndarray:
        return self.array

    def shape(self) -> list[int]:
        return list(self.array.shape)


class InferenceResponse:
    def __init__(
        self, output_tensors: list[Tensor] | None = None, error: TritonError | None = None
    ):
        self.outputs = {t.name: t.array for t in output_tensors or []}
        self.error = error


class FakeRequest:
    """An inference request as the model sees it; records what is sent back, and the flags."""

    def __init__(self, inputs: dict[str, np.ndarray], parameters: str = "{}") -> None:
        self.inputs = inputs
        self._parameters = parameters
        self.cancelled = False
        self.sent: list[tuple[InferenceResponse, int]] = []
        self.answered = threading.Event()

    def parameters(self) -> str:
        return self._parameters

    def is_cancelled(self) -> bool:
        return self.cancelled

    def get_response_sender(self) -> FakeRequest:
        return self

    def send(self, response: InferenceResponse, flags: int = 0) -> None:
        self.sent.append((response, flags))
        self.answered.set()


def text_request(*texts: str, parameters: str = "{}") -> FakeRequest:
    return FakeRequest({"TEXT": np.array([[t.encode()] for t in texts], dtype=object)}, parameters)
