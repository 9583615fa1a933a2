"""Service settings: one validated ``Settings`` value, built from the environment on first use.

Nothing is read at import time, so tests (and the CLI) can build their own ``Settings`` and
hand it to ``create_app``; ``get_settings()`` builds the process-wide one lazily and caches it.

Environment variables: ``DATABASE_URL`` and ``FRENZY_<FIELD>`` for every other field (for
example ``FRENZY_PLAN_CACHE_SIZE=2048``). ``DATABASE_PASSWORD_FILE`` names a file (a Docker
secret) whose content becomes the password of ``DATABASE_URL``, so no password needs to be
written in the URL, a compose file or the environment.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)


def state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where Frenzy keeps its state unless told otherwise (the SQLite database, checkpoints,
    job logs): ``$FRENZY_HOME``, else ``$XDG_DATA_HOME/frenzy``, else
    ``~/.local/share/frenzy`` — one absolute folder per user, so every command finds the same
    state from any directory."""
    env = os.environ if environ is None else environ
    if env.get("FRENZY_HOME"):
        return Path(env["FRENZY_HOME"]).expanduser().absolute()
    data = env.get("XDG_DATA_HOME") or str(Path(env.get("HOME") or Path.home()) / ".local"
                                           / "share")
    return Path(data).expanduser().absolute() / "frenzy"


def default_database_url(environ: Mapping[str, str] | None = None) -> str:
    """The embedded database: ``frenzy.db`` in ``state_dir``."""
    return f"sqlite:///{state_dir(environ) / 'frenzy.db'}"


def default_checkpoint_dir(environ: Mapping[str, str] | None = None) -> str:
    """Checkpoints (and the job logs beside them): ``checkpoints`` in ``state_dir``."""
    return str(state_dir(environ) / "checkpoints")


LEGACY_DATABASE = Path("var") / "frenzy.db"
"""Where the database lived before ``state_dir`` (relative to the working directory)."""


class SettingsError(ValueError):
    """An environment variable holds a value the service cannot use."""


class Settings(BaseModel):
    """Everything the service needs to know that is not in the database."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    database_url: str = Field(
        default_factory=default_database_url,
        description="SQLAlchemy URL; postgresql:// is read as postgresql+psycopg://",
    )
    sqlite_busy_timeout_ms: int = Field(5000, ge=0, description="SQLite busy timeout")
    sqlite_checkpoint_s: float = Field(
        1.0, ge=0, description="SQLite: seconds between WAL checkpoints that each process "
                               "of the service runs on a thread of its own (0: SQLite "
                               "checkpoints inside the commits, which makes writers wait)")
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
    logs_follow_max_s: float = Field(
        3600.0, gt=0, description="a followed log stream (GET /v1/jobs/{id}/logs?follow=true) "
                                  "ends after this long; clients reconnect with offset")
    queue_ttl_s: float = Field(
        1.0, ge=0, description="how long the queue's explanation (why each job waits) is "
                               "shared by requests before it is worked out again")
    memory_residual_ttl_s: float = Field(
        30.0, ge=0, description="how long submissions reuse the measured memory corrections "
                                "of recent jobs (predictor.residual) before rereading them")
    memory_residual: bool = Field(
        True, description="plan with the online memory residual (measured peaks of recent "
                          "jobs of the same runtime, GPU type and model family)")
    step_correction: Literal["auto", "on", "off"] = Field(
        "auto", description="plan on step times corrected from the ones running jobs report "
                            "(an online estimator per job and per GPU type x model family): "
                            "on, off, or auto (on where the backend measures real GPUs: a "
                            "Ray cluster joined through RAY_ADDRESS; off on the emulated "
                            "cluster, whose CPU workers are no measure of a GPU, and on the "
                            "simulated backend, which runs every plan at its prediction)")
    extra_gpu_pools: dict[str, int] = Field(
        default_factory=dict,
        description="GPU pools the cluster may gain (e.g. an autoscaler's node groups), as "
                    "TYPE:COUNT,...: submissions are planned for them too, so a job can wait "
                    "in the queue for a GPU type no live node has yet",
    )
    max_body_bytes: int = Field(
        1 << 20, ge=1024,
        description="largest request body; larger ones get a 413 before any other work",
    )
    quota_max_gpus: int = Field(
        0, ge=0, description="per user: GPUs held plus the new job's smallest plan (0: none)")
    quota_max_queued: int = Field(
        0, ge=0, description="per user: jobs waiting for GPUs (PENDING) at once (0: none)")
    quota_max_steps: int = Field(
        0, ge=0, description="per job: optimizer steps (0: none)")
    quota_max_job_time_s: float = Field(
        0.0, ge=0, description="per job: predicted run time of its fastest plan (0: none)")
    max_runtime_s_default: float = Field(
        0.0, ge=0, description="per job: seconds it may spend running when it asks for no "
                               "max_runtime_s; then stopped at a checkpoint (0: none)")
    max_runtime_s_max: float = Field(
        0.0, ge=0, description="per job: the largest max_runtime_s a job may ask for; also "
                               "the limit of a job that asks for none when "
                               "max_runtime_s_default is 0 (0: any)")
    auto_migrate: bool = Field(False, description="run Alembic migrations when the app starts")
    default_page_size: int = Field(50, ge=1)
    max_page_size: int = Field(500, ge=1)
    api_title: str = "Frenzy"
    checkpoint_dir: str = Field(
        default_factory=default_checkpoint_dir, min_length=1,
        description="where the built-in trainer writes checkpoints (shared by every node); "
                    "default: checkpoints in the state directory (state_dir)")

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

    @field_validator("extra_gpu_pools", mode="before")
    @classmethod
    def _parse_pools(cls, value: Any) -> Any:
        """``"A100-80G:4,L4:2"`` (the environment's form) or a mapping."""
        if not isinstance(value, str):
            return value
        pools: dict[str, int] = {}
        for item in filter(None, (p.strip() for p in value.split(","))):
            name, sep, count = item.rpartition(":")
            if not sep or not name or not count.strip().isdigit() or int(count) < 1:
                raise ValueError(f"{item!r}: write TYPE:COUNT with COUNT >= 1, e.g. A100-80G:4")
            pools[name.strip()] = int(count)
        return pools

    @model_validator(mode="after")
    def _runtime_default_within_max(self) -> Settings:
        if (self.max_runtime_s_max and self.max_runtime_s_default > self.max_runtime_s_max):
            raise ValueError(f"max_runtime_s_default ({self.max_runtime_s_default:g}) is above "
                             f"max_runtime_s_max ({self.max_runtime_s_max:g})")
        return self

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """Settings from ``environ`` (default ``os.environ``), then ``overrides``.

        Raises ``SettingsError`` naming the variable when a value does not validate.
        """
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {"database_url": default_database_url(env),
                                  "checkpoint_dir": default_checkpoint_dir(env)}
        if env.get("DATABASE_URL"):
            values["database_url"] = env["DATABASE_URL"]
        if env.get("DATABASE_PASSWORD_FILE"):
            values["database_url"] = _with_password_file(
                values["database_url"], env["DATABASE_PASSWORD_FILE"])
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
            var = ("DATABASE_URL" if field == "database_url"
                   else f"FRENZY_{field.upper()}" if first["loc"] else "settings")
            raise SettingsError(f"{var}: {first['msg']}") from exc


def _with_password_file(url: str, path: str) -> str:
    """``url`` with the password read from the file ``path`` (surrounding blanks dropped)."""
    from sqlalchemy.engine import make_url

    try:
        password = Path(path).read_text().strip()
    except OSError as exc:
        raise SettingsError(f"DATABASE_PASSWORD_FILE: cannot read {path}: {exc.strerror}") \
            from exc
    if not password:
        raise SettingsError(f"DATABASE_PASSWORD_FILE: {path} is empty")
    return make_url(url).set(password=password).render_as_string(hide_password=False)


@functools.cache
def get_settings() -> Settings:
    """The process-wide settings, built from the environment on first call."""
    return Settings.from_env()
