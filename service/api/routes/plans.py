"""Plan preview: the same body as a submission, answered with the ranked plans only."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ContextDep, CurrentUser
from service.api.views import model_public, training_public
from service.schemas import ErrorPublic, JobCreate, PlanPublic, PlansPublic

router = APIRouter(
    prefix="/plans", tags=["plans"],
    responses={401: {"model": ErrorPublic}, 422: {"model": ErrorPublic}},
)


@router.post("", response_model=PlansPublic, summary="Preview a job's ranked plans",
             description=(
                 "The ranked plans a submission with this body would get on this cluster "
                 "(GPU type and count, layout, per-GPU memory, predicted step and job time), "
                 "without submitting anything."))
def preview_plans(body: JobCreate, ctx: ContextDep, _user: CurrentUser) -> PlansPublic:
    """Nothing is stored or submitted."""
    planned = ctx.planning.plan(body, ctx.inventory.get())
    return PlansPublic(
        model=model_public(planned.model),
        training=training_public(planned.train, planned.train.num_steps),
        gpu_types=list(planned.gpu_types), max_gpus=planned.max_gpus,
        count=len(planned.plan_dicts),
        plans=[PlanPublic.model_validate(d) for d in planned.plan_dicts],
        notes=list(planned.notes),
    )
