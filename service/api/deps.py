"""Dependencies of the routes, as ``Annotated`` aliases (``SessionDep``, ``CurrentUser``...).

``AppContext`` is everything a route may need that is not in the request: settings, the
session factory, the runner, the cluster provider, the planning service and the clock. It
is built once by ``create_app`` and lives on ``app.state``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from service.api.errors import ApiError
from service.api.inventory import ClusterProvider, InventoryCache
from service.api.planning import PlanningService
from service.api.quotas import Quotas
from service.auth import Principal, hash_token, plausible_token
from service.db import repositories as repo
from service.db.pg_async import AsyncJobWriter, AsyncPg
from service.db.sqlite_reads import SqliteReads
from service.db.writer import JobWriter
from service.queue_view import QueueCache
from service.runner import JobRunner
from service.settings import Settings


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
    writer: JobWriter | AsyncJobWriter | None = None
    """Group commit of submissions (``service.db.writer``, or ``service.db.pg_async`` on
    PostgreSQL); None: one transaction each."""
    pg: AsyncPg | None = None
    """Async PostgreSQL connections for the hot reads (None on SQLite)."""
    sqlite: SqliteReads | None = None
    """The hot reads on SQLite, on the event loop (``service.db.sqlite_reads``)."""
    quotas: Quotas = field(default_factory=Quotas)
    """Per-user limits checked at submission (``service.api.quotas``)."""
    queue: QueueCache | None = None
    """Why queued jobs wait, shared by the requests of a second (``service.queue_view``);
    built from ``session_factory`` when not given."""

    def __post_init__(self) -> None:
        if self.queue is None:
            self.queue = QueueCache(self.session_factory, self.cluster_provider,
                                    self.settings.queue_ttl_s)


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


def _token_row(ctx: AppContext, token_hash: str) -> tuple[Any, ...] | None:
    """(id, owner, is_admin) of the live token: one Core query on a pooled connection."""
    with ctx.engine.connect() as conn:
        row = conn.execute(repo.ACTIVE_TOKEN, {"token_hash": token_hash, "now": ctx.clock()}
                           ).first()
    return None if row is None else tuple(row)


async def get_current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    """The caller of a bearer token; 401 without a live one.

    The token is looked up on every request (no cache: a revoked or expired token fails
    on the next request): on SQLite as a local read on the event loop
    (``service.db.sqlite_reads``), on PostgreSQL with
    async psycopg (``service.db.pg_async``), on another database in the thread pool.
    (The context is read from the request, not through ``ContextDep``: one dependency
    less to resolve on every authenticated request.)
    """
    ctx: AppContext = request.app.state.ctx
    challenge = {"WWW-Authenticate": "Bearer"}
    if credentials is None or credentials.scheme.lower() != "bearer":
        raise ApiError(
            401, "Authorization", "missing; send 'Authorization: Bearer <token>'", challenge
        )
    token = credentials.credentials
    principal: Principal | None = None
    if plausible_token(token):
        digest = hash_token(token)
        if ctx.pg is not None:
            row = await ctx.pg.read_token(digest, ctx.clock())
        elif ctx.sqlite is not None:  # a local file read: microseconds
            row = ctx.sqlite.read_token(digest, ctx.clock())
        else:
            row = await run_in_threadpool(_token_row, ctx, digest)
        if row is not None:
            principal = Principal(owner=str(row[1]), is_admin=bool(row[2]),
                                  token_id=int(row[0]))
    if principal is None:
        raise ApiError(401, "Authorization", "unknown, revoked or expired token", challenge)
    return principal


CurrentUser = Annotated[Principal, Depends(get_current_user)]


async def get_admin(user: CurrentUser) -> Principal:
    """The caller, who must hold an admin token (403 otherwise)."""
    if not user.is_admin:
        raise ApiError(403, "Authorization", "needs an admin token (frenzy token create --admin)")
    return user


AdminUser = Annotated[Principal, Depends(get_admin)]
