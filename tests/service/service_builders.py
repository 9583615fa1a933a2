"""Small builders shared by the service tests (imported by name: no conftest imports)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa
from fastapi.testclient import TestClient

from predictor.gpus import get_gpu
from service.db import repositories as repo
from service.db.engine import write_session

T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@dataclass
class Clock:
    """A settable clock for the app (time is passed in)."""

    now: datetime = T0

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Env:
    client: TestClient
    runner: Any
    factory: sa.orm.sessionmaker
    clock: Clock
    tokens: dict[str, str]

    def headers(self, who: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}", **extra}

    def count(self, table: str) -> int:
        with self.factory() as s:
            return int(s.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one())


def add_nodes(factory: sa.orm.sessionmaker, spec: dict[str, tuple[str, int]]) -> None:
    """Nodes {id: (gpu_type, gpus)} with the catalog's memory for the type."""
    with write_session(factory) as s:
        for node_id, (gpu_type, gpus) in spec.items():
            repo.upsert_node(
                session=s, node_id=node_id, gpu_type=gpu_type,
                gpu_memory=get_gpu(gpu_type).memory_bytes, total_gpus=gpus, now=T0,
                interconnect=get_gpu(gpu_type).link,
            )


def job_body(**overrides: Any) -> dict[str, Any]:
    """A small valid submission (gpt2, batch 32 × 1024 tokens, 100 steps)."""
    body: dict[str, Any] = {
        "model": "gpt2",
        "training": {"global_batch": 32, "seq_len": 1024, "steps": 100},
    }
    body.update(overrides)
    return body
