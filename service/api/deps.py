"""Dependencies of the routes, as ``Annotated`` aliases (``SessionDep``, ``CurrentUser``...).

``AppContext`` is everything a route may need that is not in the request: settings, the
session factory, the runner, the cluster provider, the planning service and the clock. It
is built once by ``create_app`` and lives on ``app.state``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.inventory import ClusterProvider, InventoryCache
from service.api.planning import PlanningService
from service.auth import Principal, hash_token, verify_token
from service.db.pg_async import AsyncJobWriter, AsyncPg
from service.db.writer import JobWriter
from service.runner import JobRunner
from service.settings import Settings


class TokenCache:
    """Verified tokens remembered for ``ttl_s`` seconds (by hash), so most requests skip
    the token lookup; a revoked token stops working within ``ttl_s``."""

    def __init__(self, ttl_s: float, max_entries: int = 10_000) -> None:
        self._ttl = ttl_s
        self._max = max_entries
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[float, Principal]] = {}

    def get(self, key: str) -> Principal | None:
        if not self._ttl:
            return None
        with self._lock:
            hit = self._entries.get(key)
        if hit is None or time.monotonic() - hit[0] > self._ttl:
            return None
        return hit[1]

    def put(self, key: str, principal: Principal) -> None:
        if not self._ttl:
            return
        with self._lock:
            if len(self._entries) >= self._max:
                self._entries.clear()
            self._entries[key] = (time.monotonic(), principal)


@dataclass
class AppContext:
    settings: Settings
    engine: Engine
    session_factory: sessionmaker[Session]
    runner: JobRunner
    cluster_provider: ClusterProvider
    planning: PlanningService
    inventory: InventoryCache
    clock: Callable[[], datetime]
    tokens: TokenCache = field(default_factory=lambda: TokenCache(0))
    writer: JobWriter | AsyncJobWriter | None = None
    """Group commit of submissions (``service.db.writer``, or ``service.db.pg_async`` on
    PostgreSQL); None: one transaction each."""
    pg: AsyncPg | None = None
    """Async PostgreSQL connections for the hot reads (None on SQLite)."""


async def get_context(request: Request) -> AppContext:
    """(``async``: resolved on the event loop, not through the thread pool.)"""
    return request.app.state.ctx


ContextDep = Annotated[AppContext, Depends(get_context)]


def get_session(ctx: ContextDep) -> Iterator[Session]:
    """A read session for the request (writes go through ``write_session``)."""
    with ctx.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_session)]

_bearer = HTTPBearer(auto_error=False, description="API token: `frenzy token create`")


def _verify(ctx: AppContext, token: str) -> Principal | None:
    with ctx.session_factory() as session:
        return verify_token(session=session, token=token)


async def get_current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller of a bearer token; 401 without a valid one.

    ``async`` so a cached token costs no thread-pool round trip; a token not in the cache
    is looked up in the thread pool, with its own short session so the request never
    holds two connections at once. (The context is read from the request, not through
    ``ContextDep``: one dependency less to resolve on every authenticated request.)
    """
    ctx: AppContext = request.app.state.ctx
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401, "Authorization", "missing; send 'Authorization: Bearer <token>'", challenge
        )
    key = hash_token(credentials.credentials)
    principal = ctx.tokens.get(key)
    if principal is None:
        principal = await run_in_threadpool(_verify, ctx, credentials.credentials)
        if principal is None:
            raise ApiError(401, "Authorization", "unknown or revoked token", challenge)
        ctx.tokens.put(key, principal)
    return principal


CurrentUser = Annotated[Principal, Depends(get_current_user)]


async def get_admin(user: CurrentUser) -> Principal:
    """The caller, who must hold an admin token (403 otherwise)."""
    if not user.is_admin:
        raise ApiError(403, "Authorization", "needs an admin token (frenzy token create --admin)")
    return user


AdminUser = Annotated[Principal, Depends(get_admin)]
