"""One error shape for every 4xx/5xx: ``{"detail": "field: what is wrong", "errors": [...]}``.

``detail`` is a single line a person can act on; ``errors`` lists each problem with the
request field it concerns (dotted path, e.g. ``training.global_batch``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.schemas import RETIRED_FIELDS

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error the API reports to the client, naming the field it concerns."""

    def __init__(
        self,
        status_code: int,
        field: str,
        message: str,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.status_code = status_code
        self.field = field
        self.message = message
        self.headers = dict(headers or {})


def error_body(items: Sequence[tuple[str, str]]) -> dict[str, Any]:
    detail = "; ".join(f"{f}: {m}" if f else m for f, m in items)
    return {"detail": detail, "errors": [{"field": f, "message": m} for f, m in items]}


def _field_of(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):
        parts = parts[1:]
    return ".".join(parts) or "body"


def _message_of(err: Mapping[str, Any]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        loc = err.get("loc") or ()
        retired = RETIRED_FIELDS.get(str(loc[-1])) if loc else None
        return retired or "unknown field; check the spelling (see /docs for the accepted fields)"
    if kind == "value_error":  # our validators' ValueError: its message, not pydantic's prefix
        error = err.get("ctx", {}).get("error")
        if error is not None:
            return str(error)
    if kind == "missing":
        return "required"
    if kind == "json_invalid":
        return f"invalid JSON: {err.get('ctx', {}).get('error', err.get('msg'))}"
    return str(err.get("msg", "invalid"))


def install_error_handlers(app: FastAPI) -> None:
    """Route every error through ``error_body`` so clients parse one shape."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            error_body([(exc.field, exc.message)]), status_code=exc.status_code,
            headers=exc.headers or None,
        )

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        items = [(_field_of(e.get("loc", ())), _message_of(e)) for e in exc.errors()]
        return JSONResponse(error_body(items or [("body", "invalid request")]), status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return JSONResponse(
            error_body([("", detail)]), status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )
