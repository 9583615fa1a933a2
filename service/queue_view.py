"""The inputs of ``service.queue_reasons.explain_queue`` gathered from the database and the
cluster view: the queue in order, the free and total GPUs per type, who holds what until
when (each job on its chosen plan, or its best plan that fits)."""

from __future__ import annotations

import functools
import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.quotas import Queued as QuotaQueued
from orchestrator.quotas import owner_room
from orchestrator.states import TERMINAL, JobState
from service.api.inventory import ClusterProvider, ClusterView, as_view
from service.auth import Principal
from service.db.models import Job
from service.queue_reasons import Holding, Need, Queued, Waiting, explain_queue, quota_waiting
from service.schemas import QueueEntryPublic, QueuePublic, WaitingPublic

LIVE_QUEUE_ROWS = (
    sa.select(Job.id, Job.name, Job.owner, Job.state, Job.priority, Job.created_at,
              Job.chosen_plan_rank, Job.total_steps, Job.steps_done)
    .where(Job.state.not_in(TERMINAL)).order_by(Job.created_at)
)
"""The live jobs, only the columns the queue needs (not their plans, metrics or specs)."""

PlanSummary = tuple[str, int, float]
"""What explaining the queue needs of a stored plan: GPU type, GPU count, step time."""


def summarise(plans: Sequence[dict[str, Any]] | None) -> list[PlanSummary]:
    """A job's ranked plans as ``PlanSummary`` values, best first."""
    return [(str(p["gpu_type"]), int(p["num_gpus"]), float(p.get("step_time_s") or 0.0))
            for p in plans or ()]


PLAN_DOCUMENTS_KEPT = 256
"""Distinct stored plan documents whose summaries ``summarise_text`` keeps."""


@functools.lru_cache(maxsize=PLAN_DOCUMENTS_KEPT)
def summarise_text(text: str | None) -> tuple[PlanSummary, ...]:
    """``summarise`` of a stored plans document as the database holds it (JSON text),
    worked out once per distinct document: identical submissions store identical
    documents, and decoding each new job's (~11 KB) in the recomputation held the GIL
    long enough to stall the worker's event loop. Shared between jobs (immutable)."""
    return tuple(summarise(None if text is None else json.loads(text)))


def _remaining(job: Any, plan: PlanSummary) -> float:
    left = max(0.0, float(job.total_steps) - float(job.steps_done))
    return left * plan[2]


def best_plan(plans: Sequence[PlanSummary], total: dict[str, int]) -> PlanSummary | None:
    """The first ranked plan that fits the cluster; else the first plan on a GPU type the
    cluster has (it is larger than the cluster); None when no plan's type is here."""
    for p in plans:
        if p[0] in total and p[1] <= total[p[0]]:
            return p
    return next((p for p in plans if p[0] in total), None)


def best_need(job: Any, plans: Sequence[PlanSummary], total: dict[str, int],
              chosen: dict[int, PlanSummary | None] | None = None) -> Need | None:
    """What ``job`` needs on its ``best_plan``. ``chosen``: the best plans worked out so
    far in this call, by the identity of the (shared, ``summarise_text``) plans sequence."""
    if chosen is None:
        p = best_plan(plans, total)
    else:
        key = id(plans)
        if key not in chosen:
            chosen[key] = best_plan(plans, total)
        p = chosen[key]
    if p is None:
        return None
    return Need(p[0], p[1], _remaining(job, p))


def _summaries(session: Session, live: Sequence[Any], known: dict[str, Sequence[PlanSummary]]
               ) -> dict[str, Sequence[PlanSummary]]:
    """The plan summaries of ``live`` jobs: from ``known`` (stored plans never change), the
    others read here (as stored text: ``summarise_text``); ``known`` is pruned to the live
    jobs."""
    missing = [j.id for j in live if j.id not in known]
    for k in range(0, len(missing), 500):
        for job_id, text in session.execute(
                sa.select(Job.id, sa.cast(Job.plans, sa.Text))
                .where(Job.id.in_(missing[k:k + 500]))):
            known[job_id] = summarise_text(text)
    ids = {j.id for j in live}
    for job_id in [i for i in known if i not in ids]:
        del known[job_id]
    return known


def queue_of(session: Session, view: ClusterView, max_owner_gpus: int = 0,
             known: dict[str, Sequence[PlanSummary]] | None = None
             ) -> tuple[list[Any], dict[str, Waiting]]:
    """The queued jobs (``LIVE_QUEUE_ROWS`` rows) in queue order (priority, then
    submission) and why each waits; ``max_owner_gpus``: ``quota_max_gpus`` (0: none),
    whose held-back jobs are found with the control loop's rule
    (``orchestrator.quotas.owner_room``, in submission order); ``known``: plan summaries
    kept from an earlier call (updated in place)."""
    free: dict[str, int] = {}
    total: dict[str, int] = {}
    for n in view.state.nodes:
        free[n.gpu_type] = free.get(n.gpu_type, 0) + n.free_gpus
        total[n.gpu_type] = total.get(n.gpu_type, 0) + n.total_gpus
    live = list(session.execute(LIVE_QUEUE_ROWS))
    plans = _summaries(session, live, {} if known is None else known)
    queued = sorted((j for j in live if j.state is JobState.PENDING),
                    key=lambda j: (-j.priority, j.created_at))
    holding = []
    held: dict[str, int] = {}
    for j in live:
        ranked = plans.get(j.id) or []
        if j.state.holds_gpus and ranked:
            rank = j.chosen_plan_rank
            plan = ranked[rank - 1] if rank and 1 <= rank <= len(ranked) else ranked[0]
            holding.append(Holding(plan[0], plan[1], _remaining(j, plan)))
            held[j.owner] = held.get(j.owner, 0) + plan[1]
    holds = {}
    if max_owner_gpus:
        _, holds = owner_room(
            [QuotaQueued(j.id, j.owner, max_owner_gpus, [p[1] for p in plans[j.id]])
             for j in sorted(queued, key=lambda j: (j.created_at, j.id)) if plans.get(j.id)],
            held)
    chosen: dict[int, PlanSummary | None] = {}  # jobs with one plans document: one search
    reasons = explain_queue([Queued(j.id, best_need(j, plans.get(j.id) or (), total, chosen))
                             for j in queued if j.id not in holds], free, total, holding)
    reasons.update({job_id: quota_waiting(h) for job_id, h in holds.items()})
    return queued, reasons


def waiting_public(w: Waiting) -> WaitingPublic:
    return WaitingPublic(kind=w.kind.value, message=w.message, gpu_type=w.gpu_type,
                         gpus_needed=w.gpus_needed, gpus_free=w.gpus_free,
                         gpus_total=w.gpus_total, jobs_ahead=w.jobs_ahead,
                         earliest_start_s=w.earliest_start_s)


class QueueCache:
    """``queue_of`` shared by every request of the same ``ttl_s`` seconds: explaining the
    queue reads every live job, so per request it would cost O(queue) — a queue of
    thousands made each ``GET /v1/jobs/{id}`` of a waiting job decode all their plans.
    When it is stale, one request works it out again while the others answer with the
    previous explanation (one recomputation in flight); only the very first waits. The
    cluster view is read from ``cluster`` only then, not per request. Plan summaries are
    kept per live job (stored plans never change).

    An explanation is fresh for ``ttl_s``, or for longer when working it out took more
    than ``max_share`` of that: it stays fresh for its own cost / ``max_share``, so however
    long the queue grows, explaining it takes at most that share of a worker's time."""

    def __init__(self, factory: sessionmaker[Session], cluster: ClusterProvider,
                 ttl_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 max_share: float = 0.05) -> None:
        if not 0 < max_share <= 1:
            raise ValueError(f"max_share must be in (0, 1], got {max_share}")
        self._factory = factory
        self._cluster = cluster
        self._ttl_s = ttl_s
        self._max_share = max_share
        self._fresh_s = ttl_s  # ttl_s, or the last explanation's cost / max_share
        self._clock = clock
        self._lock = threading.Lock()
        self._compute = threading.Lock()
        self._key: int | None = None
        self._at = -math.inf
        self._value: tuple[list[Any], dict[str, Waiting]] = ([], {})
        self._known: dict[str, Sequence[PlanSummary]] = {}

    def _fresh(self, max_owner_gpus: int) -> bool:
        """Whether the kept explanation answers for ``max_owner_gpus`` and is fresh (call
        under ``_lock``)."""
        return self._key == max_owner_gpus and self._clock() - self._at < self._fresh_s

    def peek(self, max_owner_gpus: int = 0) -> tuple[list[Any], dict[str, Waiting]] | None:
        """What ``get`` would answer without working anything out: the explanation while
        it is fresh, or while another request works out the next one; else None (then
        ``get`` works it out: the async routes call it in the thread pool)."""
        with self._lock:
            if self._fresh(max_owner_gpus) or (
                    self._key == max_owner_gpus and self._compute.locked()):
                return self._value
        return None

    def get(self, max_owner_gpus: int = 0) -> tuple[list[Any], dict[str, Waiting]]:
        """The queue in order and why each job waits (as old as the class doc says)."""
        if (known := self.peek(max_owner_gpus)) is not None:
            return known
        with self._compute:
            with self._lock:  # another request may have just worked it out
                if self._fresh(max_owner_gpus):
                    return self._value
            start = self._clock()
            view = as_view(self._cluster())
            with self._factory() as session:
                value = queue_of(session, view, max_owner_gpus, self._known)
            done = self._clock()
            with self._lock:
                self._key, self._at, self._value = max_owner_gpus, done, value
                self._fresh_s = max(self._ttl_s, (done - start) / self._max_share)
            return value


def waiting_for(queue: tuple[list[Any], dict[str, Waiting]], job_id: str
                ) -> WaitingPublic | None:
    """Why queued job ``job_id`` waits in ``queue`` (``QueueCache.get``'s answer); None
    when it is not queued any more."""
    w = queue[1].get(job_id)
    return None if w is None else waiting_public(w)


def queue_public(queue: QueueCache, user: Principal,
                 max_owner_gpus: int = 0) -> QueuePublic:
    """The whole queue in order; ids and names of other users' jobs are left out."""
    queued, reasons = queue.get(max_owner_gpus)
    return QueuePublic(data=[
        QueueEntryPublic(position=i, job_id=j.id if user.can_see(j.owner) else None,
                         name=j.name if user.can_see(j.owner) else None,
                         owner=j.owner if user.can_see(j.owner) else None,
                         waiting=waiting_public(reasons[j.id]))
        for i, j in enumerate(queued, start=1)])
