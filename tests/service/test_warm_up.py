"""The API's warm-up before it serves (``service.api.app.warm_up``): the first requests of
each worker no longer pay for FastAPI building its route state and for the planner's first
run; it answers its own requests with 401 (no token), so it writes nothing, and plans once
through the default planner only (an injected planner is left alone)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.api import app as app_module
from service.api import create_app
from service.db.engine import migrate
from service.settings import Settings


def _counts(url: str) -> tuple[int, int, int]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(sa.text(f"SELECT count(*) FROM {t}")).scalar_one()
                         for t in ("jobs", "events", "tokens"))  # type: ignore[return-value]
    finally:
        engine.dispose()


def test_warm_up_plans_once_and_writes_nothing(tmp_path: Path, monkeypatch: Any) -> None:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    migrate(url)
    calls: list[tuple[str, list[str] | None, int]] = []
    real = app_module.default_planner

    def counting(model: Any, train: Any, gpu_types: Any, **kw: Any) -> Any:
        calls.append((model.name, gpu_types, kw["max_gpus"]))
        return real(model, train, gpu_types, **kw)

    monkeypatch.setattr(app_module, "default_planner", counting)
    before = _counts(url)
    app = create_app(settings=Settings(database_url=url))
    with TestClient(app) as client:
        assert len(calls) == 1 and calls[0][0] == "gpt2" and calls[0][2] == 1
        assert len(calls[0][1] or []) == 1  # one GPU type of the catalog
        assert client.get("/healthz").status_code == 200
        assert client.get("/v1/jobs/warm-up").status_code == 401  # what warm-up saw
    assert _counts(url) == before  # nothing written


def test_an_injected_planner_is_not_called_at_start(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    migrate(url)
    calls: list[Any] = []

    def stub(*a: Any, **kw: Any) -> Any:
        calls.append(a)
        raise AssertionError("no planning at start-up with an injected planner")

    with TestClient(create_app(settings=Settings(database_url=url), planner=stub)):
        pass
    assert calls == []
