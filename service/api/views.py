"""Build the Public response models from rows and specs (one place for the shapes)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from predictor.errors import SpecError
from predictor.spec import ModelSpec, TrainingSpec
from service.db.models import AllocationRow, Job, PlanRow
from service.schemas import (
    AllocationPublic,
    JobPublic,
    JobSummary,
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
            data["num_params"] = ModelSpec(**spec).num_params()
        except (SpecError, TypeError) as exc:  # a row written by an older schema
            log.warning("stored model spec does not rebuild: %s", exc)
        return ModelPublic.model_validate(data)
    return ModelPublic(
        name=spec.name, family=spec.family.value, num_layers=spec.num_layers,
        hidden_size=spec.hidden_size, num_heads=spec.num_heads,
        num_kv_heads=spec.num_kv_heads, ffn_hidden_size=spec.ffn_hidden_size,
        vocab_size=spec.vocab_size, max_seq_len=spec.max_seq_len,
        tie_embeddings=spec.tie_embeddings, type_vocab_size=spec.type_vocab_size,
        num_params=spec.num_params(),
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


def job_summary(job: Job) -> JobSummary:
    return JobSummary(
        id=job.id, name=job.name, owner=job.owner, state=job.state,
        state_reason=job.state_reason, model_name=job.model_name, priority=job.priority,
        progress=progress_public(job), deadline_at=job.deadline_at,
        created_at=job.created_at, updated_at=job.updated_at,
    )


def job_public(
    job: Job,
    plans: Sequence[PlanRow] | Sequence[dict[str, Any]],
    allocations: Sequence[AllocationRow],
) -> JobPublic:
    """The full job: ``plans`` as rows or as the ``Plan.to_dict()`` forms just stored."""
    plan_models = [
        PlanPublic.model_validate(
            p.detail | {"rank": p.rank} if isinstance(p, PlanRow) else p
        )
        for p in plans
    ]
    for i, p in enumerate(plan_models, start=1):
        if not p.rank:
            plan_models[i - 1] = p.model_copy(update={"rank": i})
    chosen = next((p for p in plan_models if p.rank == job.chosen_plan_rank), None)
    return JobPublic(
        **job_summary(job).model_dump(),
        model=model_public(job.model_spec),
        training=training_public(job.training, int(job.total_steps)),
        deadline_s=job.deadline_s, entrypoint=job.entrypoint, plans=plan_models,
        chosen_plan=chosen,
        allocation=[AllocationPublic.model_validate(a) for a in allocations],
        placed_at=job.placed_at, started_at=job.started_at, finished_at=job.finished_at,
    )
