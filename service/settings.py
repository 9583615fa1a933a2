"""Service settings: one validated ``Settings`` value, built from the environment on first use.

Nothing is read at import time, so tests (and the CLI) can build their own ``Settings`` and
hand it to ``create_app``; ``get_settings()`` builds the process-wide one lazily and caches it.

Environment variables: ``DATABASE_URL`` and ``FRENZY_<FIELD>`` for every other field (for
example ``FRENZY_PLAN_CACHE_SIZE=2048``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

DEFAULT_DATABASE_URL = "sqlite:///./var/frenzy.db"


class SettingsError(ValueError):
    """An environment variable holds a value the service cannot use."""


class Settings(BaseModel):
    """Everything the service needs to know that is not in the database."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str = Field(
        DEFAULT_DATABASE_URL,
        description="SQLAlchemy URL; postgresql:// is read as postgresql+psycopg://",
    )
    sqlite_busy_timeout_ms: int = Field(5000, ge=0, description="SQLite busy timeout")
    db_pool_size: int = Field(10, ge=1, description="connections kept per process (PostgreSQL)")
    db_max_overflow: int = Field(20, ge=0)
    plan_cache_size: int = Field(
        1024, ge=0, description="plan results cached per (model, training, GPU types) body"
    )
    max_gpus: int = Field(64, ge=1, description="upper bound on one plan's GPU count")
    max_plans_per_job: int = Field(64, ge=1, description="ranked plans stored per job")
    plans_shown: int = Field(
        5, ge=1, description="ranked plans a job response carries by default (?plans=all)"
    )
    ranking: str = Field("gpu_seconds", description="default plan ranking (predictor.planner)")
    inventory_ttl_s: float = Field(
        1.0, ge=0, description="how long submissions reuse the cluster's GPU-type inventory"
    )
    token_cache_ttl_s: float = Field(
        5.0, ge=0, description="verified tokens are remembered this long (revocation lag)"
    )
    auto_migrate: bool = Field(False, description="run Alembic migrations when the app starts")
    default_page_size: int = Field(50, ge=1)
    max_page_size: int = Field(500, ge=1)
    api_title: str = "Frenzy"
    checkpoint_dir: str = Field(
        "var/checkpoints", min_length=1,
        description="where the built-in trainer writes checkpoints (shared by every node)")

    @field_validator("database_url")
    @classmethod
    def _normalise_url(cls, value: str) -> str:
        """Accept the URLs people paste (postgres://, postgresql://) and pick psycopg 3."""
        value = value.strip()
        if not value:
            raise ValueError("must not be empty")
        for prefix in ("postgres://", "postgresql://"):
            if value.startswith(prefix):
                return "postgresql+psycopg://" + value[len(prefix):]
        return value

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``environ`` (default ``os.environ``), then ``overrides``.

        Raises ``SettingsError`` naming the variable when a value does not validate.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        if env.get("DATABASE_URL"):
            values["database_url"] = env["DATABASE_URL"]
        for name in cls.model_fields:
            key = f"FRENZY_{name.upper()}"
            if key in env:
                values[name] = env[key]
        values.update(overrides)
        try:
            return cls(**values)
        except ValidationError as exc:
            first = exc.errors()[0]
            field = str(first["loc"][0]) if first["loc"] else "?"
            var = "DATABASE_URL" if field == "database_url" else f"FRENZY_{field.upper()}"
            raise SettingsError(f"{var}: {first['msg']}") from exc


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, built from the environment on first call."""
    return Settings.from_env()
