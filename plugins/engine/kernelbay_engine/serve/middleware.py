"""ASGI middleware of the server: request bodies bounded (413), answered requests counted by status."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException

from kernelbay_engine.serve.errors import APIError

KNOWN_PATHS = frozenset({"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"})


def too_large(limit: int) -> APIError:
    return APIError(
        413, f"the request body is larger than this server's limit of {limit} bytes", code="request_too_large"
    )


class BodyLimit:
    """Refuse a body past `limit` bytes with 413: at once by its Content-Length, or as it arrives when chunked."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length", "")
        if length.isdigit() and int(length) > self.limit:
            await too_large(self.limit).response()(scope, receive, send)
            return
        received = 0

        async def bounded_receive():
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:  # raised inside the route's body read: the error handlers answer it
                raise HTTPException(413, too_large(self.limit).message)
            return message

        await self.app(scope, bounded_receive, send)


class StatusCounter:
    """Reads each response's status as it starts; unknown paths count as "other" (bounded label values)."""

    def __init__(self, app, counter):
        self.app, self.counter = app, counter

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        endpoint = scope["path"] if scope["path"] in KNOWN_PATHS else "other"

        async def counting_send(message):
            if message["type"] == "http.response.start":
                self.counter.labels(endpoint, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
