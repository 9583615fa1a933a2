"""Build the Public response models from rows and specs (one place for the shapes)."""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from orchestrator.states import JobState
from predictor.errors import SpecError
from predictor.spec import ModelSpec, TrainingSpec
from service.db.models import AllocationRow, Job
from service.job_memory import memory_public
from service.schemas import (
    AllocationPublic,
    JobPublic,
    JobSummary,
    MetricsPublic,
    ModelPublic,
    PlanPublic,
    ProgressPublic,
    TrainingPublic,
)

log = logging.getLogger(__name__)


def model_public(spec: ModelSpec | dict[str, Any]) -> ModelPublic:
    if isinstance(spec, dict):
        data = dict(spec)
        try:
            rebuilt = ModelSpec(**spec)
            data["num_params"], data["head_dim"] = rebuilt.num_params(), rebuilt.head_dim
        except (SpecError, TypeError) as exc:  # a row written by an older schema
            log.warning("stored model spec does not rebuild: %s", exc)
        return ModelPublic.model_validate(data)
    return ModelPublic(
        name=spec.name, family=spec.family.value, num_layers=spec.num_layers,
        hidden_size=spec.hidden_size, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, ffn_hidden_size=spec.ffn_hidden_size,
        vocab_size=spec.vocab_size, max_seq_len=spec.max_seq_len,
        tie_embeddings=spec.tie_embeddings, type_vocab_size=spec.type_vocab_size,
        head_dim=spec.head_dim, num_params=spec.num_params(),
    )


def training_public(train: TrainingSpec | dict[str, Any], num_steps: int) -> TrainingPublic:
    if isinstance(train, TrainingSpec):
        return TrainingPublic(
            global_batch=train.global_batch, seq_len=train.seq_len,
            precision=train.precision.value, optimizer=train.optimizer.value,
            steps=train.steps, tokens=train.tokens, deadline_s=train.deadline_s,
            flash_attention=train.flash_attention, sequence_parallel=train.sequence_parallel,
            num_steps=num_steps,
        )
    return TrainingPublic.model_validate({**train, "num_steps": num_steps})


def progress_public(job: Job) -> ProgressPublic:
    total = int(job.total_steps)
    return ProgressPublic(
        steps_done=job.steps_done, total_steps=total,
        fraction=min(1.0, job.steps_done / total) if total else 0.0,
    )


def metrics_public(windows: list[dict[str, Any]] | str | None) -> MetricsPublic | None:
    """The ``metrics`` block from the stored windows (a list, or its JSON text)."""
    if isinstance(windows, str):
        windows = json.loads(windows)
    if not windows:
        return None
    out = MetricsPublic.model_validate({"windows": windows, "latest": None})
    return out.model_copy(update={"latest": out.windows[-1]})


def accounting(job: Any, gpu_seconds: float | None) -> dict[str, float | None]:
    """``duration_s`` and ``gpu_hours`` of a job row (``gpu_seconds``: from
    ``repositories.gpu_seconds_by_job``; None when it never held a GPU)."""
    duration = None
    if job.finished_at is not None and job.placed_at is not None:
        duration = max(0.0, (job.finished_at - job.placed_at).total_seconds())
    return {"duration_s": duration,
            "gpu_hours": None if gpu_seconds is None else gpu_seconds / 3600.0}


def job_summary(job: Job) -> JobSummary:
    return JobSummary(
        id=job.id, name=job.name, owner=job.owner, state=job.state,
        state_reason=job.state_reason, model_name=job.model_name, priority=job.priority,
        progress=progress_public(job), deadline_at=job.deadline_at,
        created_at=job.created_at, updated_at=job.updated_at,
    )


def job_public(
    job: Job,
    plans: Sequence[dict[str, Any]],
    allocations: Sequence[AllocationRow],
    shown: int | None = None,
) -> JobPublic:
    """The full job with its first ``shown`` ranked plans (None: all) and the plan chosen.

    ``plans`` are the stored ``Plan.to_dict()`` forms (ranks 1..n)."""
    total = len(plans)
    keep = plans if shown is None else plans[:shown]
    plan_models = [
        PlanPublic.model_validate(p if p.get("rank") else {**p, "rank": i})
        for i, p in enumerate(keep, start=1)
    ]
    chosen_dict = None
    if job.chosen_plan_rank and 1 <= job.chosen_plan_rank <= total:
        chosen_dict = plans[job.chosen_plan_rank - 1]
    chosen = None
    if chosen_dict is not None:
        chosen = next((p for p in plan_models if p.rank == job.chosen_plan_rank), None)
        if chosen is None:
            chosen = PlanPublic.model_validate({**chosen_dict, "rank": job.chosen_plan_rank})
    return JobPublic(
        **job_summary(job).model_dump(),
        model=model_public(job.model_spec),
        training=training_public(job.training, int(job.total_steps)),
        deadline_s=job.deadline_s, entrypoint=job.entrypoint, plans=plan_models,
        max_runtime_s=getattr(job, "max_runtime_s", None),
        running_s=float(getattr(job, "running_s", None) or 0.0),
        plans_total=total, chosen_plan=chosen,
        allocation=[AllocationPublic.model_validate(a) for a in allocations],
        placed_at=job.placed_at, started_at=job.started_at, finished_at=job.finished_at,
        metrics=metrics_public(getattr(job, "metrics", None)),
        memory=memory_public(getattr(job, "memory", None)),
    )


# -- the hot paths: submit and get, with the parts shared between jobs cached ---------------
class _Lru:
    """A small thread-safe LRU map (values are immutable once built)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Any) -> Any:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: Any, value: Any) -> Any:
        with self._lock:
            self._data[key] = value
            while len(self._data) > self._size:
                self._data.popitem(last=False)
        return value


_SUBMITTED = _Lru(256)
_MODELS = _Lru(256)
_TRAININGS = _Lru(256)
_PLANS = _Lru(256)
_SHOWN = _Lru(1024)


def submitted_public(row: Mapping[str, Any], planned: Any, shown: int | None) -> JobPublic:
    """The response to a submission (``job_public`` of the row just inserted), from a
    template per (plan set, ``shown``): only the job's own fields are filled in."""
    key = (planned.key, planned.source, shown) if planned.key else None
    template = _SUBMITTED.get(key) if key is not None else None
    if template is None:
        job = SimpleNamespace(**row)
        job.state = JobState.PENDING
        job.model_spec, job.training = planned.model, planned.train
        template = job_public(job, planned.plan_dicts, [], shown)  # type: ignore[arg-type]
        if key is not None:
            _SUBMITTED.put(key, template)
        return template
    return template.model_copy(update={
        k: row[k] for k in ("id", "name", "owner", "state_reason", "priority", "deadline_at",
                            "created_at", "updated_at", "deadline_s", "entrypoint",
                            "max_runtime_s")
    })


def _plans_of(raw: str | None) -> list[dict[str, Any]]:
    if not raw:
        return []
    plans = _PLANS.get(raw)
    if plans is None:
        plans = _PLANS.put(raw, json.loads(raw))
    return plans


def _shown_models(raw: str | None, plans: list[dict[str, Any]],
                  shown: int | None) -> list[PlanPublic]:
    key = (raw, shown)
    models = _SHOWN.get(key)
    if models is None:
        keep = plans if shown is None else plans[:shown]
        models = _SHOWN.put(key, [
            PlanPublic.model_validate(p if p.get("rank") else {**p, "rank": i})
            for i, p in enumerate(keep, start=1)
        ])
    return models


def stored_job_public(
    row: Any, allocations: Sequence[Any], shown: int | None,
) -> JobPublic:
    """``job_public`` of a job read with ``repositories.JOB_PUBLIC_COLUMNS`` (its JSON
    documents as text): the plans, model and training parts are parsed and validated once
    per distinct document, not per request."""
    plans = _plans_of(row.plans)
    plan_models = _shown_models(row.plans, plans, shown)
    total = len(plans)
    chosen = None
    rank = row.chosen_plan_rank
    if rank and 1 <= rank <= total:
        chosen = next((p for p in plan_models if p.rank == rank), None)
        if chosen is None:
            chosen = PlanPublic.model_validate({**plans[rank - 1], "rank": rank})
    model = _MODELS.get(row.model_spec)
    if model is None:
        model = _MODELS.put(row.model_spec, model_public(json.loads(row.model_spec)))
    total_steps = int(row.total_steps)
    tkey = (row.training, total_steps)
    training = _TRAININGS.get(tkey)
    if training is None:
        training = _TRAININGS.put(tkey, training_public(json.loads(row.training), total_steps))
    return JobPublic(
        id=row.id, name=row.name, owner=row.owner, state=row.state,
        state_reason=row.state_reason, model_name=row.model_name, priority=row.priority,
        progress=progress_public(row), deadline_at=row.deadline_at,
        created_at=row.created_at, updated_at=row.updated_at,
        model=model, training=training, deadline_s=row.deadline_s, entrypoint=row.entrypoint,
        max_runtime_s=row.max_runtime_s, running_s=float(row.running_s or 0.0),
        plans=plan_models, plans_total=total, chosen_plan=chosen,
        allocation=[AllocationPublic.model_validate(a) for a in allocations],
        placed_at=row.placed_at, started_at=row.started_at, finished_at=row.finished_at,
        metrics=metrics_public(row.metrics),
        memory=memory_public(row.memory),
    )
