"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the right HTTP status.

Every failure a request can cause ends here: an `APIError` raised by the server's own checks, pydantic's
validation of the body (400), kernelbay's input errors from the engine (prompt too long, sampling out of range, a
request the KV cache can never hold: 400), unknown routes (404) and oversized bodies (413)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from kernelbay.errors import InputError
from kernelbay_engine.errors import PromptTooLong, RequestTooLarge, SamplingParamsError

log = logging.getLogger("kernelbay.serve")


class APIError(Exception):
    """A request the server refuses; becomes an OpenAI error body with `status`."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def from_engine(err: Exception) -> APIError:
    """The API error for an exception the engine raised while taking a request."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, PromptTooLong):
        return APIError(400, str(err), param="prompt", code="context_length_exceeded")
    if isinstance(err, RequestTooLarge):
        return APIError(400, str(err), param="max_tokens", code="request_too_large")
    if isinstance(err, SamplingParamsError):
        return APIError(400, str(err), code="invalid_sampling_parameter")
    if isinstance(err, InputError):
        return APIError(400, str(err), code="invalid_input")
    log.exception("request failed", exc_info=err)
    return APIError(500, f"internal error: {type(err).__name__}: {err}", type="server_error", code="internal_error")


def validation_error(err: RequestValidationError) -> APIError:
    """pydantic's first complaint about the body, naming the field: invalid JSON, a wrong type, out of range."""
    first = err.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {first.get('msg')}", code="invalid_json")
    if first.get("type") == "extra_forbidden":
        return APIError(400, f"unsupported parameter {param!r}", param=param, code="unsupported_parameter")
    given = first.get("input")
    shown = "" if isinstance(given, dict) else f" (got {given!r:.80})"
    return APIError(400, f"{param or 'body'}: {first.get('msg')}{shown}", param=param, code="invalid_value")


_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
"""OpenAI-style codes for the framework's own HTTP errors (a body cut off mid-stream at the limit is a 413)."""


def install(app: FastAPI) -> None:
    """Route every error to an OpenAI-shaped body."""

    @app.exception_handler(APIError)
    async def _api_error(request: Request, err: APIError):
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError):
        return validation_error(err).response()

    @app.exception_handler(HTTPException)
    async def _http(request: Request, err: HTTPException):
        kind = "not_found_error" if err.status_code == 404 else "invalid_request_error"
        headers = dict(err.headers) if err.headers else None
        code = _HTTP_CODES.get(err.status_code)
        return APIError(err.status_code, str(err.detail), type=kind, code=code, headers=headers).response()

    @app.exception_handler(InputError)
    async def _input(request: Request, err: InputError):
        return from_engine(err).response()

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        return from_engine(err).response()
