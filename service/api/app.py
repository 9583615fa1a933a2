"""The application factory: ``create_app(settings, runner, cluster_provider, planner)``.

Everything is built here, on call, never at import: the engine from the settings, the
default runner (``PendingRunner``: jobs stay PENDING until the Controller is plugged in),
the default cluster provider (the database's nodes and allocations) and the planner
(``predictor.planner.plan_job`` behind a cache).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from fastapi import FastAPI, Response

from predictor.gpus import load_gpu_catalog
from predictor.spec import ModelSpec, TrainingSpec
from service.api.body_limit import BodyLimit
from service.api.deps import AdminUser, AppContext
from service.api.docs import install_docs
from service.api.errors import install_error_handlers
from service.api.inventory import ClusterProvider, DbClusterProvider, InventoryCache
from service.api.planning import PlanningService, default_planner
from service.api.quotas import Quotas
from service.api.routes import admin, cluster, jobs, memory, plans
from service.dashboard import install_dashboard
from service.db.engine import WalCheckpointer, make_engine, make_session_factory, migrate
from service.db.models import utcnow
from service.db.pg_async import AsyncJobWriter, AsyncPg
from service.db.sqlite_reads import SqliteReads
from service.db.writer import JobWriter
from service.memory_residual import ResidualCache
from service.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from service.metrics import Tally, render_metrics
from service.runner import JobRunner, PendingRunner
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


WARM_UP_REQUESTS = (("GET", "/healthz"), ("GET", "/v1/jobs/warm-up"), ("POST", "/v1/jobs"))
"""Requests answered in-process, without a token (401), before the server listens."""


async def warm_up(app: FastAPI, *, ranking: str | None) -> None:
    """Do before serving what the first requests would otherwise pay for, on a loaded
    machine while every client's first request waits behind it: FastAPI builds a router's
    route state on its first match (``WARM_UP_REQUESTS`` go through the middleware and the
    routers and stop at authentication, touching no data), and the first planning imports
    the planner (``ranking``: one small job through the default planner, not the cache;
    None: no planning, e.g. when the app was given another planner)."""
    for method, path in WARM_UP_REQUESTS:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                 "method": method, "scheme": "http", "path": path,
                 "raw_path": path.encode(), "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"warm-up")], "client": ("127.0.0.1", 0),
                 "server": ("127.0.0.1", 0)}

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: object) -> None:
            return None

        try:
            await app(scope, receive, send)
        except Exception:  # a warm-up is never a reason not to serve
            log.warning("warm-up request %s %s failed", method, path, exc_info=True)
    catalog = load_gpu_catalog()
    if ranking is not None and catalog:
        try:
            default_planner(ModelSpec.from_name("gpt2"),
                            TrainingSpec(global_batch=1, seq_len=128, steps=1),
                            [next(iter(catalog))], max_gpus=1, ranking=ranking)
        except Exception:
            log.warning("warm-up planning failed", exc_info=True)


def create_app(
    settings: Settings | None = None,
    runner: JobRunner | None = None,
    cluster_provider: ClusterProvider | None = None,
    planner: Callable[..., object] | None = None,
    clock: Callable[[], datetime] | None = None,
) -> FastAPI:
    """Build the API. Missing collaborators get their defaults (see the module doc)."""
    settings = settings or get_settings()
    engine = make_engine(
        settings.database_url, busy_timeout_ms=settings.sqlite_busy_timeout_ms,
        pool_size=settings.db_pool_size, max_overflow=settings.db_max_overflow,
        auto_checkpoint=not settings.sqlite_checkpoint_s,
    )
    checkpointer = (WalCheckpointer(engine, settings.sqlite_checkpoint_s)
                    if settings.sqlite_checkpoint_s else None)
    factory = make_session_factory(engine)
    # PostgreSQL: the hot paths (GET a job, the submission batches) run on the event loop
    # with async psycopg (service.db.pg_async); SQLite keeps its writer thread, and its
    # per-request reads skip the engine's per-statement work (service.db.sqlite_reads).
    pg = (AsyncPg(settings.database_url, size=settings.db_pool_size)
          if engine.dialect.name == "postgresql" else None)
    lite = SqliteReads(engine) if engine.dialect.name == "sqlite" else None
    provider = cluster_provider or DbClusterProvider(factory)
    ctx = AppContext(
        settings=settings,
        engine=engine,
        session_factory=factory,
        runner=runner if runner is not None else PendingRunner(),
        cluster_provider=provider,
        planning=PlanningService(
            planner or default_planner, cache_size=settings.plan_cache_size,
            default_max_gpus=settings.max_gpus, default_ranking=settings.ranking,
            max_plans=settings.max_plans_per_job, hard_max_gpus=settings.quota_max_gpus,
            residual=(ResidualCache(factory, settings.memory_residual_ttl_s)
                      if settings.memory_residual else None),
        ),
        inventory=InventoryCache(provider, settings.inventory_ttl_s,
                                 extra=settings.extra_gpu_pools),
        clock=clock or utcnow,
        writer=AsyncJobWriter(pg) if pg is not None else JobWriter(engine),
        pg=pg,
        sqlite=lite,
        quotas=Quotas.from_settings(settings),
    )

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if settings.auto_migrate:
            migrate(settings.database_url)
        # The GPU catalog (a YAML file) is read before the first request, not by the
        # first submission that needs planning (it is cached for the process).
        load_gpu_catalog()
        if checkpointer is not None:
            checkpointer.start()
        if pg is not None:  # a few connections ready before the first burst of requests
            await pg.open(min(4, settings.db_pool_size))
        await warm_up(_app, ranking=settings.ranking if planner is None else None)
        yield
        if ctx.writer is not None:
            ctx.writer.close()
        if pg is not None:
            await pg.close()
        if lite is not None:
            lite.close()
        if checkpointer is not None:
            checkpointer.stop()
        engine.dispose()

    app = FastAPI(
        title=settings.api_title,
        summary="Serverless LLM training on heterogeneous GPU clusters",
        version="0.1.0",
        docs_url=None,  # service.api.docs: Swagger UI from local files
        redoc_url=None,  # ReDoc would load from a CDN
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    # Outside the routes and their dependencies: a body over the limit is refused before
    # authentication or parsing allocates anything for it (service.api.body_limit).
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    for module in (jobs, plans, memory, cluster, admin):
        app.include_router(module.router, prefix="/v1")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    tally = Tally()

    @app.get("/metrics", include_in_schema=False)
    def metrics(_admin: AdminUser) -> Response:
        """Prometheus exposition (``service.metrics``): aggregates only, for admin tokens
        (Prometheus: ``authorization: {credentials_file: ...}`` in the scrape config)."""
        with factory() as session:
            body = render_metrics(session, tally, ctx.clock())
        return Response(body, media_type=METRICS_CONTENT_TYPE)

    install_docs(app)
    install_dashboard(app)

    return app
