"""Limits the control loop enforces on a job or on its owner, read from ``JobView.extra``.

A job source that wants them sets these keys on the views it hands the loop (the service
does, from its settings and the stored job; a trace or a test list sets none, and then
nothing here costs anything):

* ``MAX_RUNTIME_KEY``: the most seconds the job may spend RUNNING, over all its launches,
  restarts and resizes (STARTING, RESIZING and waiting in the queue do not count). The
  Controller accumulates the job's running time on its clock; when it reaches the limit the
  job is checkpointed and stopped (``Backend.stop``, as a policy's stop) and ends FAILED,
  with ``runtime_limit_reason`` as its reason. ``RUNNING_S_KEY``: the seconds it ran
  before this Controller got it (a restarted service hands back what it recorded).
* ``OWNER_KEY`` and ``OWNER_MAX_GPUS_KEY``: who owns the job and the most GPUs that owner's
  jobs may hold together. Before each policy call the queue is filtered with
  ``owner_room`` (a job of an owner at the quota is held back, so no policy can place it;
  the others keep only the plans that fit in what is left), and after it the decisions are
  trimmed with ``over_quota`` (a start or a growing resize that would take an owner above
  the quota is dropped), which also stops elastic growth of a running job past the quota.

Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from scheduler.decision import Decision, DecisionKind
from scheduler.job import JobView, RunningJob

MAX_RUNTIME_KEY = "max_runtime_s"
RUNNING_S_KEY = "running_s"
OWNER_KEY = "owner"
OWNER_MAX_GPUS_KEY = "owner_max_gpus"


def max_runtime_s(view: JobView) -> float | None:
    """The job's run-time limit in seconds (None: none)."""
    value = view.extra.get(MAX_RUNTIME_KEY)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def running_s(view: JobView) -> float:
    """Seconds the job ran before this Controller got it."""
    value = view.extra.get(RUNNING_S_KEY)
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 0.0


def runtime_limit_reason(limit_s: float, used_s: float, checkpoint_step: float) -> str:
    """The reason a job stopped at its run-time limit ends with."""
    return (f"run-time limit of {limit_s:.0f} s reached after {used_s:.0f} s running; "
            f"last checkpoint step {checkpoint_step:.0f}")


def owner_quota(view: JobView) -> tuple[str, int] | None:
    """(owner, most GPUs its jobs may hold) when the job carries an owner quota."""
    owner = view.extra.get(OWNER_KEY)
    quota = view.extra.get(OWNER_MAX_GPUS_KEY)
    if isinstance(owner, str) and isinstance(quota, int) and not isinstance(quota, bool) \
            and quota > 0:
        return owner, quota
    return None


@dataclass(frozen=True, slots=True)
class QuotaHold:
    """A queued job held back because its owner is at the GPU quota."""

    owner: str
    quota: int
    held_gpus: int
    """GPUs the owner's jobs hold now."""
    reserved_gpus: int
    """GPUs the owner's earlier queued jobs may take in the same round."""
    smallest_gpus: int
    """The job's smallest plan."""


@dataclass(frozen=True, slots=True)
class Queued:
    """A queued job as ``owner_room`` sees it: its owner's quota and its plans' GPUs."""

    job_id: str
    owner: str
    quota: int
    plan_gpus: Sequence[int]


def owner_room(queue: Iterable[Queued],
               held: Mapping[str, int]) -> tuple[dict[str, int], dict[str, QuotaHold]]:
    """Walk ``queue`` in order with each owner's held GPUs (``held``): a job whose smallest
    plan does not fit in its owner's room (quota − held − reserved) is held back; another
    may run its plans up to that room (the ``caps``: job id → most GPUs), and reserves its
    largest such plan, since the policy may pick it. So the jobs let through can never
    together take an owner above the quota, whatever the policy picks; a later job of the
    same owner may wait a round for an earlier one that ends up on fewer GPUs."""
    used = dict(held)
    caps: dict[str, int] = {}
    holds: dict[str, QuotaHold] = {}
    for q in queue:
        have = used.get(q.owner, 0)
        room = q.quota - have
        fits = [g for g in q.plan_gpus if g <= room]
        if not fits:
            now_held = held.get(q.owner, 0)
            holds[q.job_id] = QuotaHold(q.owner, q.quota, now_held, have - now_held,
                                        min(q.plan_gpus, default=0))
            continue
        caps[q.job_id] = room
        used[q.owner] = have + max(fits)
    return caps, holds


def held_by_owner(running: Iterable[RunningJob]) -> dict[str, int]:
    """GPUs held per owner by the running jobs that carry an owner quota."""
    out: dict[str, int] = {}
    for r in running:
        oq = owner_quota(r.job)
        if oq is not None:
            out[oq[0]] = out.get(oq[0], 0) + r.allocation.num_gpus
    return out


def hold_queue(pending: Sequence[JobView], running: Sequence[RunningJob]
               ) -> tuple[list[JobView], dict[str, QuotaHold]]:
    """The queue a policy may place from (jobs over their owner's quota left out, the others
    with only the plans that fit) and the jobs held back. Unchanged when no job carries a
    quota."""
    queued = []
    for v in pending:
        oq = owner_quota(v)
        if oq is not None:
            queued.append(Queued(v.id, oq[0], oq[1], tuple(p.num_gpus for p in v.plans)))
    if not queued:
        return list(pending), {}
    caps, holds = owner_room(queued, held_by_owner(running))
    out: list[JobView] = []
    for v in pending:
        if v.id in holds:
            continue
        cap = caps.get(v.id)
        if cap is not None and any(p.num_gpus > cap for p in v.plans):
            v = replace(v, plans=tuple(p for p in v.plans if p.num_gpus <= cap))
        out.append(v)
    return out, holds


def over_quota(decisions: Sequence[Decision], owners: Mapping[str, tuple[str, int]],
               held: Mapping[str, tuple[str, int]]) -> list[Decision]:
    """The decisions that would take an owner above its quota, to be dropped: its starts
    and growing resizes, latest first, until the owner is back within the quota (or no
    higher than it holds now, for an owner already above it).

    ``owners``: job id → (owner, quota) of the jobs with a quota; ``held``: job id →
    (owner, GPUs) of the jobs holding GPUs now."""
    total: dict[str, int] = {}
    for owner, gpus in held.values():
        total[owner] = total.get(owner, 0) + gpus
    before = dict(total)
    delta: list[tuple[Decision, str, int]] = []  # (decision, owner, GPUs it adds)
    for d in decisions:
        oq = owners.get(d.job_id)
        if oq is None:
            continue
        owner = oq[0]
        old = held[d.job_id][1] if d.job_id in held else 0
        if d.kind is DecisionKind.STOP:
            total[owner] = total.get(owner, 0) - old
        elif d.kind in (DecisionKind.START, DecisionKind.RESIZE) and d.allocation is not None:
            add = d.allocation.num_gpus - (old if d.kind is DecisionKind.RESIZE else 0)
            total[owner] = total.get(owner, 0) + add
            if add > 0:
                delta.append((d, owner, add))
    quotas = {o: q for o, q in owners.values()}
    drop: list[Decision] = []
    for d, owner, add in reversed(delta):
        limit = max(quotas[owner], before.get(owner, 0))
        if total[owner] > limit:
            drop.append(d)
            total[owner] -= add
    return drop
