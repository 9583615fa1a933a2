"""Build the Public response models from rows and specs (one place for the shapes)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from predictor.errors import SpecError
from predictor.spec import ModelSpec, TrainingSpec
from service.db.models import AllocationRow, Job
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
        plans_total=total, chosen_plan=chosen,
        allocation=[AllocationPublic.model_validate(a) for a in allocations],
        placed_at=job.placed_at, started_at=job.started_at, finished_at=job.finished_at,
    )
