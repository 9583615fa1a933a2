"""One plan's memory from a JSON spec: the body of ``frenzy memory --spec``."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body
from pydantic import BaseModel

from predictor.errors import SpecError
from predictor.memory_spec import memory_report
from service.api.deps import CurrentUser
from service.api.errors import ApiError
from service.schemas import ErrorPublic


class MemoryPublic(BaseModel):
    """The three figures (bytes) of one plan and what they are made of."""

    tensors_bytes: int
    reserved_bytes: int
    device_bytes: int
    breakdown: dict[str, int]
    runtime: str
    gpu: str | None
    gpu_memory_bytes: int | None = None
    fits: bool | None = None


router = APIRouter(prefix="/memory", tags=["plans"],
                   responses={401: {"model": ErrorPublic}, 422: {"model": ErrorPublic}})


@router.post("", response_model=MemoryPublic, summary="Predict one plan's per-GPU memory",
             description=(
                 "The per-GPU memory one model, training config and parallel layout would "
                 "need, with its breakdown (weights, gradients, optimizer, activations). The "
                 "fields are listed in the README, section \"Memory estimate\"."))
def estimate(body: Annotated[dict[str, Any], Body()], _user: CurrentUser) -> dict[str, Any]:
    """The spec's fields are listed in README.md ("Memory estimate")."""
    try:
        return memory_report(body)
    except SpecError as exc:
        raise ApiError(422, exc.field, exc.reason) from None
