"""OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}`` with its status."""

from __future__ import annotations

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


def from_triton(status: str | None, message: str, where: str = "") -> OpenAIError:
    http, kind = TRITON_STATUS.get(status or "", (500, "server_error"))
    text = f"{where}{message}" if http == 400 else message
    return OpenAIError(http, text, kind=kind, code="overloaded" if http == 503 else None)
