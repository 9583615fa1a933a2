"""A request body size limit, enforced while the body is read and before any route runs.

``BodyLimit`` is plain ASGI middleware (no buffering of its own):

* a request that declares a ``Content-Length`` above the limit is answered 413 at once,
  before authentication, routing or a single body byte is read, and the connection is
  closed (``Connection: close``) so the server does not read the rest either;
* a body without a length (chunked) or longer than it declared is counted as the route
  reads it; the chunk that crosses the limit raises a 413 ``HTTPException`` from
  ``receive``, which the app's exception handling turns into the usual error shape.

So at most ``max_bytes`` (plus one chunk) of a body is ever held, whatever its size, and a
request without a token costs no more than the headers.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import error_body

_CLOSE = {"Connection": "close"}


def _too_large(max_bytes: int, got: str) -> str:
    return f"request body too large: at most {max_bytes:,} bytes, got {got}"


class BodyLimit:
    """Refuse request bodies over ``max_bytes`` with a 413 (see the module doc)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = None
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                declared = value
                break
        if declared is not None:
            try:
                length = int(declared)
            except ValueError:
                await _respond(send, 400, "Content-Length", "must be a whole number of bytes")
                return
            if length > self.max_bytes:
                await _respond(send, 413, "body", _too_large(self.max_bytes, f"{length:,}"))
                return
        await self.app(scope, _counting(receive, self.max_bytes), send)


def _counting(receive: Receive, max_bytes: int) -> Receive:
    """``receive`` that raises a 413 once more than ``max_bytes`` of body have arrived."""
    seen = 0

    async def wrapped() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                raise HTTPException(413, _too_large(max_bytes, f"more than {max_bytes:,}"),
                                    headers=_CLOSE)
        return message

    return wrapped


async def _respond(send: Send, status: int, field: str, message: str) -> None:
    body = json.dumps(error_body([(field, message)])).encode()
    headers: list[Any] = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
