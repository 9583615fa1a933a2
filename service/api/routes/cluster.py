"""Cluster inventory and occupancy: nodes, GPU types, free/used GPUs, who holds what.

Everyone sees every node's occupancy; job ids are shown to their owner (and to admins)
only: another user's GPUs appear with ``job_id`` null and their placements are left out,
so the ids of other users' jobs cannot be learnt here."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import ContextDep, CurrentUser, SessionDep
from service.api.inventory import as_view
from service.db import repositories as repo
from service.queue_view import queue_public
from service.schemas import (
    ClusterPublic,
    ErrorPublic,
    GpuTypePublic,
    HolderNodePublic,
    HolderPublic,
    NodePublic,
    PlacementPublic,
    QueuePublic,
)

router = APIRouter(prefix="/cluster", tags=["cluster"], responses={401: {"model": ErrorPublic}})


@router.get("", response_model=ClusterPublic, summary="Nodes, GPU types and their holders",
            description=(
                "Every node with its GPU type and memory, its free and used GPUs and the "
                "jobs holding them (other users' jobs without their ids), and the totals "
                "per GPU type."))
def get_cluster(ctx: ContextDep, user: CurrentUser, session: SessionDep) -> ClusterPublic:
    view = as_view(ctx.cluster_provider())
    shown = set(view.allocations) if user.is_admin else repo.owned_job_ids(
        session=session, owner=user.owner, job_ids=list(view.allocations))
    holders: dict[str, list[HolderPublic]] = {}
    for job_id, placement in sorted(view.allocations.items()):
        for node_id, gpus in placement:
            holders.setdefault(node_id, []).append(
                HolderPublic(job_id=job_id if job_id in shown else None, gpus=gpus))
    nodes = [
        NodePublic(
            id=n.id, gpu_type=n.gpu_type, gpu_memory_bytes=n.gpu_memory,
            total_gpus=n.total_gpus, free_gpus=n.free_gpus, used_gpus=n.used_gpus,
            interconnect=n.interconnect, holders=holders.get(n.id, []),
        )
        for n in sorted(view.state.nodes, key=lambda n: n.id)
    ]
    types: dict[str, GpuTypePublic] = {}
    for n in nodes:
        t = types.get(n.gpu_type) or GpuTypePublic(
            name=n.gpu_type, memory_bytes=0, total_gpus=0, free_gpus=0, used_gpus=0, nodes=0
        )
        types[n.gpu_type] = t.model_copy(update={
            "memory_bytes": max(t.memory_bytes, n.gpu_memory_bytes),
            "total_gpus": t.total_gpus + n.total_gpus,
            "free_gpus": t.free_gpus + n.free_gpus,
            "used_gpus": t.used_gpus + n.used_gpus,
            "nodes": t.nodes + 1,
        })
    return ClusterPublic(
        nodes=nodes,
        gpu_types=[types[k] for k in sorted(types)],
        total_gpus=view.state.total_gpus,
        free_gpus=view.state.free_gpus,
        used_gpus=view.state.total_gpus - view.state.free_gpus,
        jobs=[
            PlacementPublic(
                job_id=job_id,
                placement=[HolderNodePublic(node_id=nd, gpus=g) for nd, g in placement],
            )
            for job_id, placement in sorted(view.allocations.items()) if job_id in shown
        ],
    )


@router.get("/queue", response_model=QueuePublic,
            summary="The queue in order, each job with why it waits")
def get_queue(ctx: ContextDep, user: CurrentUser) -> QueuePublic:
    """Every queued job (yours with their ids; others' without), with a typed reason, the
    GPUs it needs and are free, the jobs ahead and an estimated earliest start."""
    return queue_public(ctx.queue, user, ctx.settings.quota_max_gpus)
