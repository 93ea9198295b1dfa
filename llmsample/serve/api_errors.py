"""Errors as OpenAI answers them: ``{"error": {"message", "type", "param", "code"}}`` with the
HTTP status a client's library turns into its own exception type (400 ``BadRequestError``,
401 ``AuthenticationError``, 404 ``NotFoundError``, 413, 503 with ``Retry-After``)."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
}


class ApiError(Exception):
    """A request the server refuses; ``param`` names the body key at fault (None: the request)."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        error = {"message": self.message, "type": TYPES.get(self.status, "invalid_request_error")}
        return {"error": {**error, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str) -> ApiError:
    """A 400 from a checker's message ``KEY: what is wrong``: the key becomes ``param``."""
    message = message.removeprefix("body.").removeprefix("body: ")
    head, sep, _ = message.partition(":")
    param = head if sep and head and " " not in head else None
    return ApiError(400, message, param)
