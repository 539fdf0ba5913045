"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with its status."""

from __future__ import annotations

import re
from typing import Any


class OpenAIError(Exception):
    """A request the adapter answers with an error; ``status`` is the HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.code = (
            status,
            message,
            kind,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        return error_body(self.message, self.kind, self.param, self.code)


def error_body(
    message: str,
    kind: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404, f"The model `{model}` does not exist", param="model", code="model_not_found"
    )


# Triton's gRPC status -> (HTTP status, OpenAI error type): the model refuses bad input with
# INVALID_ARGUMENT and a full queue with UNAVAILABLE; anything else is a fault of ours
TRITON_STATUS = {
    "StatusCode.INVALID_ARGUMENT": (400, "invalid_request_error"),
    "StatusCode.NOT_FOUND": (404, "invalid_request_error"),
    "StatusCode.UNAVAILABLE": (503, "server_error"),
    "StatusCode.RESOURCE_EXHAUSTED": (503, "server_error"),
    "StatusCode.DEADLINE_EXCEEDED": (504, "server_error"),
    "StatusCode.CANCELLED": (503, "server_error"),
}


# the model's refusal of a request parameter; the /v1 field of the same name carried it
MODEL_PARAMETER_REFUSAL = re.compile(r"parameter ([a-z_]+) (.*)", re.DOTALL)


def model_refusal(message: str, where: str = "") -> OpenAIError:
    """A 400 for what the model refused; one of its request parameters named as the field."""
    parameter = MODEL_PARAMETER_REFUSAL.fullmatch(message)
    if parameter is None:
        return bad_request(f"{where}{message}")
    name, rest = parameter.groups()
    return bad_request(f"{where}`{name}` {rest}", param=name)


# codes of refusals other APIs answer with statuses of their own (TEI, Cohere): a request with
# no inputs (TEI's 400, not 422), a model of another kind than the route serves (TEI's 424)
EMPTY = "empty"
WRONG_MODEL = "wrong_model"
# the model's refusal when its queue holds its limit (python_backend.scheduling.fair_queue):
# the one 503 that says "come back later", which TEI and Cohere answer with 429
QUEUE_FULL = "queue_full"


def from_triton(status: str | None, message: str, where: str = "") -> OpenAIError:
    http, kind = TRITON_STATUS.get(status or "", (500, "server_error"))
    if http == 400:
        return model_refusal(message, where)
    code = None
    if http == 503:
        code = QUEUE_FULL if "queue full" in message else "overloaded"
    return OpenAIError(http, message, kind=kind, code=code)
