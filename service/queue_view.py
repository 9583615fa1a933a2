"""The inputs of ``service.queue_reasons.explain_queue`` gathered from the database and the
cluster view: the queue in order, the free and total GPUs per type, who holds what until
when (each job on its chosen plan, or its best plan that fits)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from orchestrator.quotas import Queued as QuotaQueued
from orchestrator.quotas import owner_room
from orchestrator.states import JobState
from service.api.inventory import ClusterView
from service.auth import Principal
from service.db import repositories as repo
from service.db.models import Job
from service.queue_reasons import Holding, Need, Queued, Waiting, explain_queue, quota_waiting
from service.schemas import QueueEntryPublic, QueuePublic, WaitingPublic


def _remaining(job: Job, plan: dict[str, Any]) -> float:
    left = max(0.0, float(job.total_steps) - float(job.steps_done))
    return left * float(plan.get("step_time_s") or 0.0)


def best_need(job: Job, total: dict[str, int]) -> Need | None:
    """The job's first ranked plan that fits the cluster; else its first plan on a GPU type
    the cluster has (it is larger than the cluster); None when no plan's type is here."""
    plans: Sequence[dict[str, Any]] = job.plans or []
    here = [p for p in plans if p.get("gpu_type") in total]
    fits = [p for p in here if int(p["num_gpus"]) <= total[p["gpu_type"]]]
    p = (fits or here or [None])[0]
    if p is None:
        return None
    return Need(p["gpu_type"], int(p["num_gpus"]), _remaining(job, p))


def queue_of(session: Session, view: ClusterView,
             max_owner_gpus: int = 0) -> tuple[list[Job], dict[str, Waiting]]:
    """The queued jobs in queue order (priority, then submission) and why each waits;
    ``max_owner_gpus``: ``quota_max_gpus`` (0: none), whose held-back jobs are found with
    the control loop's rule (``orchestrator.quotas.owner_room``, in submission order)."""
    free: dict[str, int] = {}
    total: dict[str, int] = {}
    for n in view.state.nodes:
        free[n.gpu_type] = free.get(n.gpu_type, 0) + n.free_gpus
        total[n.gpu_type] = total.get(n.gpu_type, 0) + n.total_gpus
    live = repo.live_jobs(session=session, with_plans=True)
    queued = sorted((j for j in live if j.state is JobState.PENDING),
                    key=lambda j: (-j.priority, j.created_at))
    holding = []
    held: dict[str, int] = {}
    for j in live:
        if j.state.holds_gpus and j.plans:
            rank = j.chosen_plan_rank
            plan = j.plans[rank - 1] if rank and 1 <= rank <= len(j.plans) else j.plans[0]
            holding.append(Holding(plan["gpu_type"], int(plan["num_gpus"]),
                                   _remaining(j, plan)))
            held[j.owner] = held.get(j.owner, 0) + int(plan["num_gpus"])
    holds = {}
    if max_owner_gpus:
        _, holds = owner_room(
            [QuotaQueued(j.id, j.owner, max_owner_gpus, [int(p["num_gpus"]) for p in j.plans])
             for j in sorted(queued, key=lambda j: (j.created_at, j.id)) if j.plans], held)
    reasons = explain_queue([Queued(j.id, best_need(j, total)) for j in queued
                             if j.id not in holds], free, total, holding)
    reasons.update({job_id: quota_waiting(h) for job_id, h in holds.items()})
    return queued, reasons


def waiting_public(w: Waiting) -> WaitingPublic:
    return WaitingPublic(kind=w.kind.value, message=w.message, gpu_type=w.gpu_type,
                         gpus_needed=w.gpus_needed, gpus_free=w.gpus_free,
                         gpus_total=w.gpus_total, jobs_ahead=w.jobs_ahead,
                         earliest_start_s=w.earliest_start_s)


def waiting_for(factory: sessionmaker[Session], view: ClusterView,
                job_id: str, max_owner_gpus: int = 0) -> WaitingPublic | None:
    """Why queued job ``job_id`` waits (None when it is not queued any more)."""
    with factory() as session:
        _, reasons = queue_of(session, view, max_owner_gpus)
    w = reasons.get(job_id)
    return None if w is None else waiting_public(w)


def queue_public(factory: sessionmaker[Session], view: ClusterView,
                 user: Principal, max_owner_gpus: int = 0) -> QueuePublic:
    """The whole queue in order; ids and names of other users' jobs are left out."""
    with factory() as session:
        queued, reasons = queue_of(session, view, max_owner_gpus)
    return QueuePublic(data=[
        QueueEntryPublic(position=i, job_id=j.id if user.can_see(j.owner) else None,
                         name=j.name if user.can_see(j.owner) else None,
                         owner=j.owner if user.can_see(j.owner) else None,
                         waiting=waiting_public(reasons[j.id]))
        for i, j in enumerate(queued, start=1)])
