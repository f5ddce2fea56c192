"""The one error shape every endpoint answers with, so a client can always find the field at fault.

It is SGLang's streaming-error envelope (`{"error": {"message", "type", "code"}}`) with OpenAI's `param`
naming the field.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


class RequestError(ValueError):
    """A request the server refuses; `field` is the dotted name of the offending field, in the client's terms."""

    def __init__(self, field: str, message: str, status_code: int = 400):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.status_code = status_code


def error_body(message: str, field: str | None, status_code: int) -> dict:
    kind = "invalid_request_error" if status_code < 500 else "internal_error"
    return {"error": {"message": message, "type": kind, "param": field, "code": status_code}}


def error_response(err: RequestError) -> JSONResponse:
    return JSONResponse(error_body(str(err), err.field, err.status_code), status_code=err.status_code)
