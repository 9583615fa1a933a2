"""The one control loop: queue, cluster state, policy, backend, events.

``Controller`` is shared by the simulator (``SimBackend`` over a virtual clock) and
production (Ray backend over wall time). It owns the authoritative ``ClusterState`` and every
job's ``JobState``. On every event — an arrival (``submit``), a cancellation, a backend event,
a periodic ``tick`` — it asks the policy what to do with the current queue and running set,
then applies the decisions: the cluster state is updated with ``allocate`` / ``release``
(which raise on over-allocation, so a policy bug cannot double-book a GPU) and the backend is
told to start / stop / resize. Each state change becomes a ``JobEvent`` passed to the
listeners (metrics in simulation, the database in the service).

Fail-safe: a policy that raises — or returns decisions that cannot be applied (a GPU granted
twice, a start of a running job: ``check`` finds it before anything is applied) — never
stops scheduling. The round is dropped, its inputs
(cluster, queue, running jobs, time) are logged as one JSON line that is enough to replay it
(``replay_record``), a ``PolicyAlert`` goes to the alert listeners, and the fallback policy
(``has-paper`` unless given: the paper's start-only HAS, which only places queued jobs on
free GPUs) decides that round instead. The next round asks the configured policy again.

Nothing here knows whether time is simulated, where jobs come from or how the loop is
driven: that is ``orchestrator.loop.ControlLoop``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
import traceback
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from orchestrator.backend import (
    Backend,
    BackendEvent,
    Clock,
    Failed,
    Finished,
    OutOfMemory,
    Preempted,
    Progress,
    Started,
)
from orchestrator.oom import replan_after_oom, stored_plans
from orchestrator.quotas import (
    QuotaHold,
    hold_queue,
    max_runtime_s,
    over_quota,
    owner_quota,
    running_s,
    runtime_limit_reason,
)
from orchestrator.states import HOLDING, JobEvent, JobState, submitted, transition
from scheduler.cluster import Allocation, CapacityError, ClusterState, Node
from scheduler.decision import Decision, DecisionKind
from scheduler.job import JobView, RunningJob
from scheduler.policy import Policy, make_policy
from scheduler.policy import holds_until as policy_holds_until
from scheduler.policy import wake_at as policy_wake_at

log = logging.getLogger(__name__)

Listener = Callable[[JobEvent], None]
"""Receives every ``JobEvent``; progress reports come as events whose ``from_state`` equals
their ``to_state`` (RUNNING → RUNNING, ``reason == "progress"``)."""

MAX_RESCHEDULE_ROUNDS = 64
FALLBACK_POLICY = "has-paper"
"""What decides a round whose policy raised: HAS as Algorithm 1 publishes it. It only starts
queued jobs on free GPUs, so a round of it stops, shrinks or moves no running job."""
KEPT_ALERTS = 16
KEPT_FINISHED = 1024
"""Ended jobs the Controller still answers ``job(id)`` for after they left its working set."""
KEPT_POLICY_CALLS = 4096
"""Policy calls whose timings are kept (``policy_calls``, ``policy_wall_s``)."""


@dataclass(frozen=True, slots=True)
class PolicyAlert:
    """A scheduling round whose policy raised: what failed, who decided instead, and the
    round's inputs (``inputs``: the exact objects, so ``replay`` re-runs the call)."""

    time: float
    policy: str
    error: str
    fallback: str | None  # the policy that decided the round; None when it failed too
    job_ids: tuple[str, ...]  # the queue and the running jobs of the round
    inputs: tuple[ClusterState, tuple[JobView, ...], tuple[RunningJob, ...], float] = field(
        repr=False, compare=False)

    @property
    def message(self) -> str:
        then = (f"this round was decided by {self.fallback}" if self.fallback
                else "this round was dropped")
        return f"scheduling policy {self.policy} failed ({self.error}); {then}"

    def replay(self, policy: Policy) -> list[Decision]:
        """Call ``policy`` on this round's inputs again (debugging a failure)."""
        state, pending, running, now = self.inputs
        return policy.decide(state, pending, running, now)


AlertListener = Callable[[PolicyAlert], None]


def replay_record(state: ClusterState, pending: Sequence[JobView],
                  running: Sequence[RunningJob], now: float) -> dict[str, Any]:
    """A policy call's inputs as JSON values: the nodes, every queued and running job with
    its plans, progress and allocation, and the time."""

    def view(v: JobView) -> dict[str, Any]:
        return {"id": v.id, "submit_time": v.submit_time, "total_steps": v.total_steps,
                "steps_done": v.steps_done, "requested_gpus": v.requested_gpus,
                "requested_gpu_type": v.requested_gpu_type, "deadline": v.deadline,
                "priority": v.priority, "restarts": v.restarts,
                "plans": [p.to_dict() for p in v.plans]}

    return {
        "now": now,
        "inter_node_bw_gbs": state.inter_node_bw_gbs,
        "nodes": [asdict(n) for n in state.nodes],
        "pending": [view(v) for v in pending],
        "running": [{**view(r.job), "started_at": r.started_at,
                     "allocation": {"plan_rank": r.allocation.plan.rank,
                                    "gpu_type": r.allocation.plan.gpu_type,
                                    "placement": [list(p) for p in r.allocation.placement]}}
                    for r in running],
    }


def _code(d: Decision) -> dict[str, str]:
    """The decision's typed reason as event data (``code``), when the policy gave one."""
    return {"code": d.code.value} if d.code is not None else {}


class ControllerError(RuntimeError):
    """A decision that cannot be applied: unknown job, or a job in the wrong state."""


@dataclass(slots=True)
class JobRecord:
    """The controller's mutable bookkeeping of one job (never handed to a policy)."""

    view: JobView
    state: JobState
    allocation: Allocation | None = None
    allocated_at: float | None = None  # when the current allocation was granted
    first_start: float | None = None  # first time the job was granted GPUs (queue end)
    end_time: float | None = None
    limit_s: float | None = None  # run-time limit (``orchestrator.quotas``); None: none
    running_s: float = 0.0  # seconds RUNNING before the current run (closed runs)
    running_since: float | None = None  # when the current run began (None: not RUNNING)

    def running_time(self, now: float) -> float:
        """Seconds the job has spent RUNNING by ``now``, over all its runs."""
        if self.running_since is None:
            return self.running_s
        return self.running_s + max(0.0, now - self.running_since)


RetireListener = Callable[[JobRecord], None]
"""Receives a job's final record when it leaves the Controller's working set (after its
terminal event reached every ``Listener``)."""


class JobTable(Mapping[str, JobRecord]):
    """The jobs the Controller answers for: the live ones (its working set) and the latest
    ended ones it still keeps (``keep_finished``). A read-only view; lookups are O(1)."""

    __slots__ = ("_ended", "_live")

    def __init__(self, live: dict[str, JobRecord], ended: Mapping[str, JobRecord]) -> None:
        self._live = live
        self._ended = ended

    def __getitem__(self, job_id: str) -> JobRecord:
        rec = self._live.get(job_id)
        if rec is None:
            return self._ended[job_id]
        return rec

    def __contains__(self, job_id: object) -> bool:
        return job_id in self._live or job_id in self._ended

    def __iter__(self) -> Iterator[str]:
        yield from self._ended
        yield from self._live

    def __len__(self) -> int:
        return len(self._live) + len(self._ended)


class Controller:
    """Queue + cluster state + policy + backend. See the module docstring.

    Bounded memory: a job leaves the working set as soon as its terminal event has been
    passed to the listeners (then ``retire_listeners`` get its final record); the latest
    ``keep_finished`` ended jobs stay answerable by ``job`` (None: all of them), and the
    timings of the latest ``keep_policy_calls`` policy calls are kept (None: all). Nothing
    a scheduling round does scans ended jobs.
    """

    def __init__(
        self,
        policy: Policy,
        backend: Backend,
        state: ClusterState,
        clock: Clock,
        *,
        listeners: Sequence[Listener] = (),
        fallback: Policy | None = None,
        alert_listeners: Sequence[AlertListener] = (),
        retire_listeners: Sequence[RetireListener] = (),
        keep_finished: int | None = KEPT_FINISHED,
        keep_policy_calls: int | None = KEPT_POLICY_CALLS,
    ) -> None:
        for name, keep in (("keep_finished", keep_finished),
                           ("keep_policy_calls", keep_policy_calls)):
            if keep is not None and keep < 0:
                raise ValueError(f"{name} must be >= 0 or None (keep all), got {keep}")
        self.policy = policy
        self._fallback = fallback
        self._alert_listeners: list[AlertListener] = list(alert_listeners)
        self.alerts: deque[PolicyAlert] = deque(maxlen=KEPT_ALERTS)
        """The latest policy failures (their inputs included, for replay)."""
        self.policy_failures = 0
        self.backend = backend
        self.clock = clock
        self._state = state
        self._jobs: dict[str, JobRecord] = {}  # live jobs only: the working set
        self._ended: OrderedDict[str, JobRecord] = OrderedDict()  # latest ended, oldest first
        self._keep_finished = keep_finished
        self._retire_listeners: list[RetireListener] = list(retire_listeners)
        self.ended: Counter[JobState] = Counter()
        """Jobs ended so far, by terminal state."""
        self._listeners: list[Listener] = list(listeners)
        self.wake_at: float | None = None
        """When the policy's last call asked to be called again with nothing else happening
        (``scheduler.policy.wake_at``); event-driven drivers (the simulator) tick then."""
        self.holds_until: float | None = None
        """The latest start the policy's last call booked for a job it keeps waiting on
        purpose (``scheduler.policy.holds_until``): until then a waiting job is not stuck."""
        self._batch_depth = 0
        self._scheduling = False
        self._dirty = False
        self.policy_call_count = 0
        """``policy.decide`` calls so far."""
        self.policy_wall_s: deque[float] = deque(maxlen=keep_policy_calls)
        """Wall-clock seconds of the latest ``policy.decide`` calls (scheduling overhead)."""
        self.policy_calls: deque[tuple[int, int, float]] = deque(maxlen=keep_policy_calls)
        """(pending jobs, running jobs, wall seconds) of the latest ``policy.decide`` calls."""
        self._limited: set[str] = set()  # live jobs with a run-time limit
        self._quota_jobs = 0  # live jobs whose owner has a GPU quota
        self.quota_holds: dict[str, QuotaHold] = {}
        """Queued jobs the last round held back from the policy: their owner is at its GPU
        quota (``orchestrator.quotas``)."""
        backend.connect(self.on_event)

    # -- queries ---------------------------------------------------------------------------
    @property
    def cluster(self) -> ClusterState:
        return self._state

    @property
    def jobs(self) -> JobTable:
        """The live jobs and the latest ended ones by id (see ``JobTable``)."""
        return JobTable(self._jobs, self._ended)

    @property
    def live(self) -> Mapping[str, JobRecord]:
        """The jobs not yet ended: the working set (read-only by convention)."""
        return self._jobs

    def job(self, job_id: str) -> JobRecord:
        rec = self._jobs.get(job_id) or self._ended.get(job_id)
        if rec is None:
            raise ControllerError(f"unknown job {job_id!r}")
        return rec

    def pending(self) -> list[JobView]:
        """The queue in arrival order (submit time, then id)."""
        out = [r.view for r in self._jobs.values() if r.state is JobState.PENDING]
        out.sort(key=lambda v: (v.submit_time, v.id))
        return out

    def running(self) -> list[RunningJob]:
        """Jobs holding GPUs, with their latest progress."""
        out = []
        for r in self._jobs.values():
            if r.allocation is None:
                continue
            view = r.view
            if r.state is JobState.RUNNING:
                steps = self.backend.steps_done(view.id)
                if steps != view.steps_done:
                    view = replace(view, steps_done=steps)
            out.append(RunningJob(view, r.allocation, r.allocated_at or 0.0))
        out.sort(key=lambda rj: (rj.job.submit_time, rj.job.id))
        return out

    def active(self) -> bool:
        """Is any job not yet in a terminal state?"""
        return bool(self._jobs)

    def subscribe(self, listener: Listener) -> None:
        self._listeners.append(listener)

    def subscribe_alerts(self, listener: AlertListener) -> None:
        self._alert_listeners.append(listener)

    def subscribe_retired(self, listener: RetireListener) -> None:
        self._retire_listeners.append(listener)

    # -- inputs ----------------------------------------------------------------------------
    def submit(self, job: JobView) -> None:
        """A job arrives with the ranked plans made at its submission: queue it, and
        schedule. A job without plans fails at once (nothing here plans)."""
        if job.id in self._jobs or job.id in self._ended:
            raise ControllerError(f"job {job.id!r} submitted twice")
        now = self.clock.now()
        rec = self._jobs[job.id] = JobRecord(view=job, state=JobState.PENDING,
                                             limit_s=max_runtime_s(job),
                                             running_s=running_s(job))
        if rec.limit_s is not None:
            self._limited.add(job.id)
        if owner_quota(job) is not None:
            self._quota_jobs += 1
        self._emit(submitted(job.id, now))
        if not job.plans:
            self._move(job.id, JobState.FAILED, "no plan fits this cluster's GPU types")
        self._request_schedule()

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> None:
        """Cancel a job in any non-terminal state; its GPUs are freed at once."""
        rec = self.job(job_id)
        if rec.state.terminal:
            raise ControllerError(f"job {job_id} is already {rec.state.value}")
        if rec.state in (JobState.STARTING, JobState.RUNNING, JobState.RESIZING):
            self.backend.cancel(job_id)
        self._release(rec)
        self._move(job_id, JobState.CANCELLED, reason)
        self._request_schedule()

    def tick(self) -> None:
        """A periodic scheduling round with no other cause (round-based policies)."""
        self._request_schedule()

    # -- run-time limits ---------------------------------------------------------------------
    def next_limit_time(self) -> float | None:
        """When the next running job reaches its run-time limit (None: no job will)."""
        due = None
        for job_id in self._limited:
            rec = self._jobs[job_id]
            if rec.running_since is None or rec.limit_s is None:
                continue
            t = rec.running_since + max(0.0, rec.limit_s - rec.running_s)
            due = t if due is None else min(due, t)
        return due

    def enforce_limits(self, now: float | None = None) -> list[str]:
        """Stop every job whose running time has reached its run-time limit: checkpoint
        (``Backend.stop``, the path a policy's stop takes), release its GPUs, end it FAILED
        with ``orchestrator.quotas.runtime_limit_reason``. Returns the ids stopped."""
        if not self._limited:
            return []
        now = self.clock.now() if now is None else now
        hit = []
        for job_id in self._limited:
            rec = self._jobs[job_id]
            if rec.limit_s is not None and rec.running_time(now) >= rec.limit_s - 1e-9:
                hit.append(job_id)
        for job_id in sorted(hit):
            self._stop_at_limit(self._jobs[job_id], now)
        if hit:
            self._request_schedule()
        return hit

    def _stop_at_limit(self, rec: JobRecord, now: float) -> None:
        assert rec.limit_s is not None
        used = rec.running_time(now)
        job_id = rec.view.id
        reason = f"run-time limit of {rec.limit_s:.0f} s reached"
        if rec.state in (JobState.STARTING, JobState.RUNNING, JobState.RESIZING):
            steps = self.backend.stop(job_id, reason)
        else:
            steps = rec.view.steps_done
        rec.view = replace(rec.view, steps_done=steps)
        self._release(rec)
        self._move(job_id, JobState.FAILED, runtime_limit_reason(rec.limit_s, used, steps),
                   steps_done=steps, running_s=used, max_runtime_s=rec.limit_s)

    def on_event(self, event: BackendEvent) -> None:
        """Apply one backend report to the job's state, then schedule."""
        rec = self._jobs.get(event.job_id)
        if rec is None or rec.state.terminal:
            log.debug("ignoring %s for %s job %s", type(event).__name__,
                      rec.state.value if rec else "unknown", event.job_id)
            return
        if isinstance(event, Progress):
            if rec.state is JobState.RUNNING:
                rec.view = replace(rec.view, steps_done=max(rec.view.steps_done,
                                                              event.steps_done))
                data: dict[str, object] = {"steps_done": event.steps_done, "loss": event.loss,
                                           "samples_per_s": event.samples_per_s}
                if event.peak_tensors_bytes is not None:
                    data["peak_tensors_bytes"] = event.peak_tensors_bytes
                    data["peak_reserved_bytes"] = event.peak_reserved_bytes
                if rec.limit_s is not None:
                    data["running_s"] = rec.running_time(self.clock.now())
                self._emit(JobEvent(rec.view.id, event.time, JobState.RUNNING,
                                    JobState.RUNNING, "progress", rec.allocation, data))
            return
        if isinstance(event, Started):
            if rec.state not in (JobState.STARTING, JobState.RESIZING):
                log.debug("stale Started for %s job %s", rec.state.value, rec.view.id)
                return
            self._move(rec.view.id, JobState.RUNNING, "workers running")
        elif isinstance(event, Finished):
            if rec.state is not JobState.RUNNING:
                log.debug("stale Finished for %s job %s", rec.state.value, rec.view.id)
                return
            rec.view = replace(rec.view, steps_done=float(rec.view.total_steps))
            self._release(rec)
            self._move(rec.view.id, JobState.SUCCEEDED, "all steps done")
        elif isinstance(event, Failed):
            self._release(rec)
            self._move(rec.view.id, JobState.FAILED, event.reason)
        elif isinstance(event, OutOfMemory):
            if not rec.state.holds_gpus or rec.allocation is None:
                return
            self._out_of_memory(rec, event)
        elif isinstance(event, Preempted):
            if not rec.state.holds_gpus:
                return
            rec.view = replace(rec.view, steps_done=event.steps_done,
                               restarts=rec.view.restarts + 1)
            self._release(rec)
            self._move(rec.view.id, JobState.PENDING, f"preempted: {event.reason}",
                       steps_done=event.steps_done)
        else:  # pragma: no cover - the union is closed
            raise TypeError(f"unknown backend event {event!r}")
        self._request_schedule()

    def _out_of_memory(self, rec: JobRecord, event: OutOfMemory) -> None:
        """Re-plan from the job's own plans with its measured memory (``orchestrator.oom``)
        and queue it again from its checkpoint; fail it when no plan fits any more."""
        assert rec.allocation is not None
        out = replan_after_oom(rec.view, rec.allocation.plan, event, self._state)
        self._release(rec)
        data = {"held_bytes": event.held_bytes, "cap_bytes": event.cap_bytes,
                "memory_factor": out.memory_factor}
        if out.view is None:
            self._move(rec.view.id, JobState.FAILED, out.reason, **data)
            return
        if out.replanned:  # new plans: whoever stores the job's plans keeps these
            data["replanned_plans"] = stored_plans(out.view.plans, out.memory_factor)
        rec.view = replace(out.view, steps_done=event.steps_done,
                           restarts=rec.view.restarts + 1)
        self._move(rec.view.id, JobState.PENDING, out.reason, steps_done=event.steps_done,
                   **data)

    def sync_nodes(self, nodes: Sequence[Node]) -> None:
        """Reconcile the cluster with a fresh inventory (nodes joining, leaving, resized),
        keeping every granted GPU accounted: a node that left while a job still holds GPUs
        on it stays until that job is released (its backend reports the loss), and a node
        that shrank below its used GPUs keeps its old size until then."""
        current = self._state.by_id
        fresh = {n.id: n for n in nodes}
        state = self._state
        for node_id, old in current.items():
            if node_id not in fresh:
                if old.used_gpus == 0:
                    state = state.without_node(node_id)
                    log.info("node %s left the cluster", node_id)
                else:
                    log.info("node %s left; kept until its %d busy GPUs are released",
                             node_id, old.used_gpus)
        for node_id, new in fresh.items():
            old = current.get(node_id)
            if old is None:
                state = state.with_node(replace(new, free_gpus=new.total_gpus))
                log.info("node %s joined: %d x %s", node_id, new.total_gpus, new.gpu_type)
            elif ((old.total_gpus, old.gpu_type) != (new.total_gpus, new.gpu_type)
                  and new.total_gpus >= old.used_gpus):
                state = state.with_node(replace(new, free_gpus=new.total_gpus - old.used_gpus))
        if state != self._state:
            self._state = state
            self._request_schedule()

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Defer scheduling until the block ends: many simultaneous events, one decision."""
        self._batch_depth += 1
        try:
            yield
        finally:
            self._batch_depth -= 1
            if self._batch_depth == 0 and self._dirty:
                self._request_schedule()

    # -- scheduling ------------------------------------------------------------------------
    def _request_schedule(self) -> None:
        if self._batch_depth or self._scheduling:
            self._dirty = True
            return
        self._scheduling = True
        try:
            for _ in range(MAX_RESCHEDULE_ROUNDS):
                self._dirty = False
                self._schedule_once()
                if not self._dirty:
                    break
            else:
                log.warning("scheduling did not settle after %d rounds", MAX_RESCHEDULE_ROUNDS)
        finally:
            self._scheduling = False

    def _schedule_once(self) -> None:
        pending = self.pending()
        running = self.running()
        if not pending and not running:
            return
        now = self.clock.now()
        t0 = time.perf_counter()
        if self._quota_jobs:
            pending, self.quota_holds = hold_queue(pending, running)
        try:
            decisions = self.policy.decide(self._state, pending, running, now)
            self.wake_at = policy_wake_at(self.policy)
            self.holds_until = policy_holds_until(self.policy)
            self.check(decisions)
        except Exception as exc:
            decisions = self._fail_safe(exc, pending, running, now)
        if self._quota_jobs and decisions:
            decisions = self._within_quotas(decisions, running)
        wall = time.perf_counter() - t0
        self.policy_call_count += 1
        self.policy_wall_s.append(wall)
        self.policy_calls.append((len(pending), len(running), wall))
        if decisions:
            self.apply(decisions)

    def _fail_safe(self, exc: Exception, pending: list[JobView], running: list[RunningJob],
                   now: float) -> list[Decision]:
        """The policy raised: log the round's inputs, alert, let the fallback decide."""
        self.policy_failures += 1
        self.wake_at = None  # periodic ticks and events call the policy again
        self.holds_until = None
        error = f"{type(exc).__name__}: {exc}"
        log.error("policy %s raised at t=%.3f, round dropped: %s\n%s", self.policy.name, now,
                  error, "".join(traceback.format_exception(exc)).rstrip())
        log.error("replay inputs of the dropped round: %s",
                  json.dumps(replay_record(self._state, pending, running, now), default=str))
        fallback = self._fallback
        decisions: list[Decision] = []
        used: str | None = None
        try:
            if fallback is None:
                fallback = self._fallback = make_policy(
                    FALLBACK_POLICY, perf=getattr(self.policy, "perf", None))
            decisions = fallback.decide(self._state, pending, running, now)
            self.check(decisions)
            used = fallback.name
        except Exception:
            log.exception("fallback policy failed too; no decisions this round")
            decisions = []
        alert = PolicyAlert(
            time=now, policy=self.policy.name, error=error, fallback=used,
            job_ids=tuple(v.id for v in pending) + tuple(r.job.id for r in running),
            inputs=(self._state, tuple(pending), tuple(running), now),
        )
        self.alerts.append(alert)
        for listener in self._alert_listeners:
            try:
                listener(alert)
            except Exception:
                log.exception("alert listener failed")
        return decisions

    def _within_quotas(self, decisions: list[Decision],
                       running: list[RunningJob]) -> list[Decision]:
        """``decisions`` without the starts and growing resizes that would take an owner
        above its GPU quota (``orchestrator.quotas.over_quota``: elastic growth included);
        if what is left no longer checks (a start needed GPUs a dropped resize would have
        freed), later starts and resizes go too, so what is applied always checks."""
        owners = {}
        for job_id in {d.job_id for d in decisions}:
            rec = self._jobs.get(job_id)
            oq = owner_quota(rec.view) if rec is not None else None
            if oq is not None:
                owners[job_id] = oq
        if not owners:
            return decisions
        held = {r.job.id: (oq[0], r.allocation.num_gpus) for r in running
                if (oq := owner_quota(r.job)) is not None}
        drop = over_quota(decisions, owners, held)
        if not drop:
            return decisions
        for d in drop:
            log.info("%s %s dropped: its owner %s would hold more than %d GPUs", d.kind.value,
                     d.job_id, owners[d.job_id][0], owners[d.job_id][1])
        dropped = {id(d) for d in drop}
        kept = [d for d in decisions if id(d) not in dropped]
        while True:
            try:
                self.check(kept)
                return kept
            except (ControllerError, CapacityError) as exc:
                last = max((i for i, d in enumerate(kept)
                            if d.kind in (DecisionKind.START, DecisionKind.RESIZE)), default=None)
                if last is None:
                    return []
                log.info("%s %s dropped with the over-quota decisions: %s",
                         kept[last].kind.value, kept[last].job_id, exc)
                del kept[last]

    def check(self, decisions: Sequence[Decision]) -> None:
        """Raise ``ControllerError`` (or ``CapacityError``) unless ``apply`` can apply every
        one of ``decisions``: a policy's bad round is caught before any of it happens (no job
        half-moved, no backend told). Mirrors ``apply``'s order on a copy of the free GPUs."""
        states: dict[str, JobState] = {}
        allocs: dict[str, Allocation | None] = {}
        free = {n.id: n.free_gpus for n in self._state.nodes}

        def need(d: Decision, ok: frozenset[JobState] | tuple[JobState, ...]) -> None:
            rec = self._jobs.get(d.job_id) or self._ended.get(d.job_id)
            if rec is None:
                raise ControllerError(f"{d.kind.value} {d.job_id}: unknown job")
            state = states.get(d.job_id, rec.state)
            if state not in ok:
                raise ControllerError(f"{d.kind.value} {d.job_id}: job is {state.value}")

        def release(job_id: str) -> None:
            alloc = allocs.get(job_id, self._jobs[job_id].allocation)
            if alloc is not None:
                for node, n in alloc.placement:
                    free[node] = free.get(node, 0) + n
            allocs[job_id] = None

        def grant(d: Decision) -> None:
            assert d.allocation is not None
            for node, n in d.allocation.placement:
                if node not in free:
                    raise CapacityError(f"{d.job_id}: unknown node {node}")
                if n <= 0 or free[node] < n:
                    raise CapacityError(f"{d.job_id}: {n} GPUs on {node}, {free[node]} free")
                free[node] -= n
            allocs[d.job_id] = d.allocation

        resizes = [d for d in decisions if d.kind is DecisionKind.RESIZE]
        for d in decisions:
            if d.kind is DecisionKind.STOP:
                need(d, HOLDING)
                release(d.job_id)
                states[d.job_id] = JobState.PENDING
            elif d.kind is DecisionKind.REJECT:
                need(d, (JobState.PENDING,))
                states[d.job_id] = JobState.CANCELLED
        for d in resizes:
            need(d, (JobState.RUNNING, JobState.STARTING, JobState.RESIZING))
            release(d.job_id)
        for d in resizes:
            grant(d)
        for d in decisions:
            if d.kind is DecisionKind.START:
                need(d, (JobState.PENDING,))
                grant(d)
                states[d.job_id] = JobState.STARTING

    def apply(self, decisions: Sequence[Decision]) -> None:
        """Apply a policy's decisions: rejects (pending jobs end as CANCELLED with the
        policy's reason) and stops first, then resizes (all old allocations released before
        the new ones are granted), then starts."""
        order = {DecisionKind.REJECT: 0, DecisionKind.STOP: 0, DecisionKind.RESIZE: 1,
                 DecisionKind.START: 2}
        ordered = sorted(decisions, key=lambda d: order[d.kind])
        resizes = [d for d in ordered if d.kind is DecisionKind.RESIZE]
        for d in ordered:
            if d.kind is DecisionKind.STOP:
                self._stop(d)
            elif d.kind is DecisionKind.REJECT:
                self._holding(d, (JobState.PENDING,))
                self._move(d.job_id, JobState.CANCELLED, d.reason, **_code(d))
        for d in resizes:
            rec = self._holding(d, (JobState.RUNNING, JobState.STARTING, JobState.RESIZING))
            self._release(rec)
        for d in resizes:
            self._grant(d)
        for d in ordered:
            if d.kind is DecisionKind.START:
                rec = self.job(d.job_id)
                if rec.state is not JobState.PENDING:
                    raise ControllerError(
                        f"start {d.job_id}: job is {rec.state.value}, not pending"
                    )
                self._grant(d)
                assert rec.allocation is not None
                self._move(d.job_id, JobState.PLACED, d.reason, **_code(d))
                self.backend.start(rec.view, rec.allocation)
                self._move(d.job_id, JobState.STARTING, "launch requested")

    def _holding(self, d: Decision, states: tuple[JobState, ...]) -> JobRecord:
        rec = self.job(d.job_id)
        if rec.state not in states:
            raise ControllerError(
                f"{d.kind.value} {d.job_id}: job is {rec.state.value}; needs one of "
                f"{', '.join(s.value for s in states)}"
            )
        return rec

    def _stop(self, d: Decision) -> None:
        rec = self._holding(d, (JobState.PLACED, JobState.STARTING, JobState.RUNNING,
                                JobState.RESIZING))
        if rec.state is JobState.PLACED:
            steps = rec.view.steps_done
        else:
            steps = self.backend.stop(d.job_id, d.reason)
        rec.view = replace(rec.view, steps_done=steps, restarts=rec.view.restarts + 1)
        self._release(rec)
        self._move(d.job_id, JobState.PENDING, d.reason, steps_done=steps, **_code(d))

    def _grant(self, d: Decision) -> None:
        assert d.allocation is not None
        rec = self.job(d.job_id)
        self._state = self._state.allocate(d.allocation)  # raises CapacityError
        now = self.clock.now()
        rec.allocation = d.allocation
        rec.allocated_at = now
        if rec.first_start is None:
            rec.first_start = now
        if d.kind is DecisionKind.RESIZE:
            steps = self.backend.resize(rec.view, d.allocation)
            rec.view = replace(rec.view, steps_done=steps, restarts=rec.view.restarts + 1)
            if rec.state is JobState.RUNNING:
                self._move(d.job_id, JobState.RESIZING, d.reason, steps_done=steps,
                           **_code(d))
            else:  # STARTING / RESIZING: the relaunch simply targets the new allocation
                self._emit(JobEvent(d.job_id, now, rec.state, rec.state, d.reason,
                                    rec.allocation, {"steps_done": steps}))

    def _release(self, rec: JobRecord) -> None:
        if rec.allocation is not None:
            self._state = self._state.release(rec.allocation)
            rec.allocation = None
            rec.allocated_at = None

    def _move(self, job_id: str, dst: JobState, reason: str, **data: object) -> None:
        rec = self._jobs[job_id]
        now = self.clock.now()
        if rec.state is JobState.RUNNING and dst is not JobState.RUNNING:
            rec.running_s = rec.running_time(now)
            rec.running_since = None
            if rec.limit_s is not None:
                data.setdefault("running_s", rec.running_s)
        elif dst is JobState.RUNNING:
            rec.running_since = now
        ev = transition(job_id, now, rec.state, dst, reason,
                        allocation=rec.allocation, data=data)
        rec.state = dst
        if dst.terminal:
            rec.end_time = ev.time
        self._emit(ev)
        if dst.terminal:
            self._retire(rec)

    def _retire(self, rec: JobRecord) -> None:
        """An ended job leaves the working set (its final event has reached the listeners);
        the latest ``keep_finished`` stay answerable by ``job``."""
        job_id = rec.view.id
        del self._jobs[job_id]
        self._limited.discard(job_id)
        if owner_quota(rec.view) is not None:
            self._quota_jobs -= 1
        self.ended[rec.state] += 1
        forget = getattr(self.backend, "forget", None)
        if forget is not None:
            forget(job_id)
        keep = self._keep_finished
        if keep is None or keep > 0:
            self._ended[job_id] = rec
            if keep is not None and len(self._ended) > keep:
                self._ended.popitem(last=False)
        for listener in self._retire_listeners:
            listener(rec)

    def _emit(self, event: JobEvent) -> None:
        for listener in self._listeners:
            listener(event)
