"""The running service's control side: the orchestrator's ``ControlLoop``, fed from the
database.

``Runtime`` builds the backend (through a ``Driver``), the ``ControlLoop`` over it, the
``EventRecorder`` that writes every job event to the database, and runs the loop on its
thread. The loop's ``JobSource`` here is ``DbJobSource``:

* new submissions come from the database (the API only writes rows: the database *is* the
  queue, so any number of API worker processes can accept jobs and a crash between "row
  written" and "scheduler told" loses nothing), each with the ranked plans the API made and
  stored at submission — nothing is planned again here;
* cancellations the API recorded are passed on.

The loop reads the backend's inventory every turn; when it changes (a Ray node joined, left
or died) the ``nodes`` table is rewritten, so the API plans later submissions for it. A
policy failure (``orchestrator.controller.PolicyAlert``) is written as an ``alert`` event on
the jobs of the failed round.

Restart safety (``recover``): on start, every live job in the database is handed back to the
Controller. A job that held GPUs is first recorded as requeued (its GPUs released) at the
step the driver says it resumes from (``Driver.resume_step``: its last checkpoint on Ray,
not the last progress written, which may be ahead of it), then started again on the same
placement when those nodes still have room, and otherwise left in the queue for the policy.
Its old workers are gone: an emulated Ray cluster dies with the service, and on a long-lived
one Ray kills the actors and removes the placement groups of a dead driver. Pending jobs are
queued again in their original order. So the database and the Controller agree on every GPU
before the first request is served.

Policy state across a restart: what the policy promised (the deadline policies' admitted
jobs) is written with each job as the policy hands it out (``jobs.policy_state``, one
``scheduler.policy.PolicyNote`` per job, after the turn that changed it), and ``recover``
gives the stored notes back to the policy (``ControlLoop.restore``) once the live jobs are
submitted and before the first scheduling round: an admitted job keeps its guarantee and does
not go through admission again. Notes of the latest ``RESTORE_HISTORY`` ended jobs go too (the
``elastic`` policy's opportunity cost counts recent arrivals). See docs/deadlines.md.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import Clock
from orchestrator.controller import Controller, ControllerError, PolicyAlert
from orchestrator.estimation import EstimatorFeed, estimating_policy
from orchestrator.loop import ControlLoop, DrivenBackend, Intake
from orchestrator.oom import MEMORY_FACTOR, PLAN_MAX_GPUS, PLAN_RANKING, scale_plans
from orchestrator.quotas import MAX_RUNTIME_KEY, OWNER_KEY, OWNER_MAX_GPUS_KEY, RUNNING_S_KEY
from orchestrator.states import TERMINAL, JobEvent, JobState
from predictor.plan import Plan
from predictor.runtimes import FRENZY
from scheduler.cluster import Allocation, CapacityError, ClusterState
from scheduler.decision import start as start_decision
from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.perf import AnalyticalPerfModel
from scheduler.policy import PolicyNote
from service.api.inventory import ClusterView
from service.api.job_inputs import trainer_options
from service.api.planning import plan_gpu_cap
from service.db import repositories as repo
from service.db.engine import write_session
from service.db.models import Job, NodeRow, utcnow
from service.job_memory import stored_factor
from service.metrics import watch_loop
from service.ranking_note import ranking_event, ranking_note
from service.runner import EventRecorder, SubmittedJob, epoch_to_datetime, specs_of
from service.schemas import RETIRED_FIELDS
from service.settings import Settings

if TYPE_CHECKING:
    from orchestrator.clusters import ClusterSpec

log = logging.getLogger(__name__)

INGEST_SLACK = timedelta(seconds=30)
"""Rows are picked up by ``created_at`` / ``finished_at`` ≥ (newest seen − slack): a
transaction that stamped its row earlier but committed later is still seen."""

MAX_ALERT_EVENTS = 50
"""A failed round is recorded on at most this many of its jobs (the queue's head first)."""


class Driver(Protocol):
    """A backend the loop drives, and what the runtime must know of it.

    ``close`` releases what the backend started.
    """

    backend: DrivenBackend
    clock: Clock
    max_pipeline: int | None
    """Deepest pipeline the backend's built-in trainer runs (0: any depth; None: the backend
    runs no built-in trainer, e.g. simulated jobs); plans beyond it are kept away from the
    scheduler unless the job brings its own entrypoint."""

    measures_step_times: bool
    """Whether the step times its jobs report are the GPUs' own (what ``step_correction``
    ``auto`` learns from): False where workers emulate GPUs or a simulation replays the
    predictions."""

    def resume_step(self, job_id: str, steps_done: float, *, entrypoint: bool) -> float:
        """Where a job that held GPUs when the service died resumes, given the last progress
        recorded (``steps_done``): its newest checkpoint where the backend keeps them."""
        ...

    def close(self) -> None: ...


DriverFactory = Callable[["ClusterSpec"], Driver]
"""Builds a ``Driver`` for a cluster description, packaged or an operator's file (the Ray one
starts an emulated Ray cluster from it, or joins ``RAY_ADDRESS`` and reads the nodes from Ray)."""


class MonotonicWallClock:
    """Wall time (seconds since the epoch) that never goes backwards: the simulated
    backend's clock in the service, where its events are due at wall-clock times."""

    def __init__(self) -> None:
        self._last = time.time()
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            self._last = max(self._last, time.time())
            return self._last


class SimDriver:
    """``SimBackend`` in wall time: jobs "run" at their predicted speed, nothing trains.

    For API-only deployments, load tests and machines without Ray. Progress is reported
    every ``progress_every_s`` so the database and the dashboard move.
    """

    max_pipeline: int | None = None  # simulated jobs run any plan
    measures_step_times = False  # every plan runs at its prediction

    def __init__(
        self,
        cluster: ClusterState,
        *,
        launch_delay_s: float = 1.0,
        restart_delay_s: float = 2.0,
        progress_every_s: float = 2.0,
    ) -> None:
        from orchestrator.backends.sim import SimBackend
        from scheduler.perf import AnalyticalPerfModel

        self.clock = MonotonicWallClock()
        self.backend = SimBackend(
            self.clock, AnalyticalPerfModel(), cluster, launch_delay_s=launch_delay_s,
            restart_delay_s=restart_delay_s, progress_every_s=progress_every_s,
            keep_step_times=False,
        )

    def resume_step(self, job_id: str, steps_done: float, *, entrypoint: bool) -> float:
        """Simulated jobs keep no checkpoints: they resume from the progress recorded."""
        return steps_done

    def close(self) -> None:
        return None


def sim_driver_factory(spec: ClusterSpec) -> Driver:
    """The simulated backend on the cluster file's nodes."""
    return SimDriver(spec.state)


class WakeRunner:
    """The API's ``JobRunner`` when the loop reads the database: nothing to hand over, only
    a nudge so a new job is picked up at once rather than at the next poll."""

    nonblocking = True

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self._wake = wake

    def submit(self, job: SubmittedJob) -> None:
        if self._wake is not None:
            self._wake()

    def cancel(self, job_id: str, reason: str) -> None:
        if self._wake is not None:
            self._wake()


PLAN_DOCUMENTS_KEPT = 256
"""Distinct stored plan documents whose decoded plans ``decoded_plans`` keeps."""


@functools.lru_cache(maxsize=PLAN_DOCUMENTS_KEPT)
def decoded_plans(text: str) -> tuple[Plan, ...]:
    """The plans of a job's stored plans document (``Job.plans`` as the database holds it,
    JSON text), decoded once per distinct document: identical submissions store identical
    documents, and under a stream of them decoding each new job's plans (~11 KB of JSON,
    tens of ``Plan`` objects) was most of the Controller's CPU and, kept per queued job,
    most of what its garbage collector walked. ``Plan`` is frozen, so jobs share them."""
    return tuple(Plan.from_dict(d) for d in json.loads(text) or ())


def stored_view(job: Job, *, max_pipeline: int | None = None,
                max_owner_gpus: int = 0, plans_text: str | None = None,
                max_gpus: int | None = None, ranking: str | None = None) -> JobView | str:
    """The loop's view of a stored job, with the ranked plans stored at its submission;
    or, when none of them can run here, the reason why.

    ``max_pipeline``: when not None the backend runs the built-in trainer; plans with a
    deeper pipeline, or a ZeRO stage it does not execute (plans stored before the planner
    searched only what a runtime executes), are dropped unless the job brings its own
    entrypoint. The limits the loop enforces go in ``extra`` (``orchestrator.quotas``): the
    job's run-time limit with the seconds it has run so far, and its owner with
    ``max_owner_gpus`` (``quota_max_gpus``; 0: none). ``plans_text``: the stored plans
    document as text (``decoded_plans``), read instead of ``job.plans``. ``max_gpus`` and
    ``ranking``: the service's defaults for a plan's GPU count and the ranking
    (``Settings.max_gpus`` / ``ranking``); with the job's own ``max_gpus`` / ``ranking``
    they go in ``extra`` as at its submission, so that a job planned again after running
    out of memory (``orchestrator.oom.fresh_plans``) keeps to them."""
    try:
        model, train = specs_of(job)
        plans = (decoded_plans(plans_text) if plans_text is not None
                 else tuple(Plan.from_dict(d) for d in job.plans or ()))
    except (KeyError, TypeError, ValueError) as exc:
        return f"its stored specs or plans cannot be read ({exc})"
    if not plans:
        return "it has no stored plan"
    if max_pipeline is not None and not job.entrypoint:
        trainer = replace(FRENZY, max_pp=max_pipeline)
        why = [trainer.unsupported(p.parallel.pp, p.parallel.zero_stage) for p in plans]
        kept = tuple(p for p, w in zip(plans, why, strict=True) if w is None)
        if not kept:
            return (f"every plan of this job needs pipeline parallelism (pp > {max_pipeline}) "
                    f"or a ZeRO stage the built-in trainer does not run ({why[0]}); "
                    "give an entrypoint script, more GPUs or a smaller model")
        plans = kept
    extra: dict[str, Any] = {"entrypoint": job.entrypoint} if job.entrypoint else {}
    factor = stored_factor(job.memory)
    if factor != 1.0:  # an out-of-memory run corrected its predictions before a restart
        plans = scale_plans(plans, factor, f"memory x{factor:.2f}: measured after an "
                                           "out-of-memory run (restored)")
        extra[MEMORY_FACTOR] = factor
    if job.max_runtime_s:
        extra[MAX_RUNTIME_KEY] = float(job.max_runtime_s)
        extra[RUNNING_S_KEY] = float(job.running_s or 0.0)
    if max_owner_gpus:
        extra[OWNER_KEY] = job.owner
        extra[OWNER_MAX_GPUS_KEY] = int(max_owner_gpus)
    request_of = job.request or {}
    if request_of.get("max_gpus") or max_gpus:
        extra[PLAN_MAX_GPUS] = plan_gpu_cap(request_of.get("max_gpus"), max_gpus or 0,
                                            max_owner_gpus)
    if request_of.get("ranking") or ranking:
        extra[PLAN_RANKING] = str(request_of.get("ranking") or ranking)
    if job.entrypoint and job.request and job.request.get("working_dir"):
        extra["working_dir"] = job.request["working_dir"]  # shipped by the Ray backend
    if job.request:
        request = {k: v for k, v in job.request.items() if k not in RETIRED_FIELDS}
        try:  # the built-in trainer's data, schedule and init_from, as submitted
            extra["trainer"] = trainer_options(request, int(job.total_steps))
        except ValueError as exc:  # pydantic's ValidationError is one
            return f"its stored request cannot be read ({exc})"
    return JobView(
        id=job.id, submit_time=job.created_at.timestamp(), plans=plans,
        total_steps=int(job.total_steps), model=model, train=train,
        steps_done=float(job.steps_done),
        deadline=job.deadline_at.timestamp() if job.deadline_at else None,
        priority=job.priority,
        extra=extra,
    )


class DbJobSource:
    """The loop's ``JobSource`` in the service: PENDING rows it does not know yet (with
    their stored plans), and jobs the API ended (cancelled, or failed when refused)."""

    def __init__(self, session_factory: sessionmaker[Session], *,
                 max_pipeline: int | None = None, ranking_note: str | None = None,
                 max_owner_gpus: int = 0, max_gpus: int | None = None,
                 ranking: str | None = None) -> None:
        """``ranking_note``: why the policy does not follow a job's ranked plan order
        (``service.ranking_note``; None: it does), written as a ``ranking`` event on each
        new job that asked for a ranking. ``max_owner_gpus``: ``quota_max_gpus``, the GPUs
        one owner's jobs may hold together, enforced at placement (0: none). ``max_gpus`` /
        ``ranking``: the service's planning defaults (``stored_view``)."""
        self._factory = session_factory
        self.max_gpus = max_gpus
        self.ranking = ranking
        self.max_pipeline = max_pipeline
        self.max_owner_gpus = max_owner_gpus
        self.ranking_note = ranking_note
        self._seen_created: datetime | None = None
        self._seen_finished: datetime | None = None

    def next_time(self) -> float | None:
        return None  # rows arrive when the API writes them

    def note_created(self, at: datetime) -> None:
        if self._seen_created is None or at > self._seen_created:
            self._seen_created = at

    def view(self, job: Job, plans_text: str | None = None) -> JobView | None:
        """``stored_view`` of ``job``; a job that cannot run here is failed with the reason."""
        view = stored_view(job, max_pipeline=self.max_pipeline,
                           max_owner_gpus=self.max_owner_gpus, plans_text=plans_text,
                           max_gpus=self.max_gpus, ranking=self.ranking)
        if isinstance(view, str):
            self.fail(job.id, f"cannot run on this cluster: {view}")
            return None
        return view

    def poll(self, now: float, known: Container[str]) -> Intake:
        with self._factory() as session:
            # Ids first (cheap), whole rows only for jobs the loop does not know yet.
            stmt = sa.select(Job.id).where(Job.state == JobState.PENDING)
            if self._seen_created is not None:
                stmt = stmt.where(Job.created_at >= self._seen_created - INGEST_SLACK)
            unknown = [i for i in session.scalars(stmt) if i not in known]
            fresh: list[tuple[Job, str | None]] = []
            for k in range(0, len(unknown), 500):
                # the plans as stored text: decoded once per distinct document
                fresh.extend((job, text) for job, text in session.execute(
                    sa.select(Job, sa.cast(Job.plans, sa.Text))
                    .where(Job.id.in_(unknown[k:k + 500]))))
            fresh.sort(key=lambda row: (row[0].created_at, row[0].id))
            # Jobs the API ended (cancelled, or failed when the runner refused them); the
            # loop's own endings are already terminal in it.
            cstmt = sa.select(Job.id, Job.state_reason, Job.finished_at).where(
                Job.state.in_((JobState.CANCELLED, JobState.FAILED)),
                Job.finished_at.is_not(None))
            if self._seen_finished is not None:
                cstmt = cstmt.where(Job.finished_at >= self._seen_finished - INGEST_SLACK)
            ended = session.execute(cstmt).all()
        views = []
        for job, plans_text in fresh:
            self.note_created(job.created_at)
            view = self.view(job, "[]" if plans_text is None else plans_text)
            if view is not None:
                views.append(view)
        if self.ranking_note is not None:
            self._note_rankings([j for j, _ in fresh if (j.request or {}).get("ranking")])
        cancels = []
        for job_id, reason, finished in ended:
            if self._seen_finished is None or finished > self._seen_finished:
                self._seen_finished = finished
            if job_id in known:
                cancels.append((job_id, reason or "cancelled"))
        return Intake(views, cancels)

    def _note_rankings(self, jobs: list[Job]) -> None:
        """A ``ranking`` event on each job that asked for a ranking the policy overrides."""
        if not jobs:
            return
        assert self.ranking_note is not None
        with write_session(self._factory) as session:
            for job in jobs:
                repo.append_event(
                    session=session, job_id=job.id, kind="ranking", state=job.state.value,
                    message=ranking_event(str(job.request["ranking"]), self.ranking_note),
                    now=utcnow())

    def fail(self, job_id: str, reason: str) -> None:
        with write_session(self._factory) as session:
            row = repo.get_job(session=session, job_id=job_id, for_update=True)
            if row is not None and not row.state.terminal:
                repo.transition_job(session=session, job=row, to=JobState.FAILED,
                                    reason=reason, now=utcnow())
        log.warning("job %s failed: %s", job_id, reason)


class AlertRecorder:
    """Writes a ``PolicyAlert`` as an ``alert`` event on the jobs of the failed round."""

    def __init__(self, session_factory: sessionmaker[Session],
                 to_datetime: Callable[[float], datetime] = epoch_to_datetime) -> None:
        self._factory = session_factory
        self._to_datetime = to_datetime

    def __call__(self, alert: PolicyAlert) -> None:
        data = {"policy": alert.policy, "error": alert.error, "fallback": alert.fallback,
                "jobs_in_round": len(alert.job_ids)}
        with write_session(self._factory) as session:
            for job_id in alert.job_ids[:MAX_ALERT_EVENTS]:
                row = repo.get_job(session=session, job_id=job_id)
                if row is None:
                    continue
                repo.append_event(session=session, job_id=job_id, kind="alert",
                                  message=alert.message, state=row.state.value, data=data,
                                  now=self._to_datetime(alert.time))


RESTORE_HISTORY = 1024
"""Notes of this many of the latest ended jobs are handed to the policy's ``restore`` with
the live jobs' (history: the ``elastic`` policy's arrival window holds the last 64)."""


@dataclass
class RuntimeStats:
    """What recovery did (for logs, tests and ``frenzy status``); the loop keeps its own
    (``Runtime.loop.stats``)."""

    recovered_requeued: int = 0
    recovered_reattached: int = 0
    recovered_pending: int = 0
    restored_notes: int = 0
    placement_latency_s: list[float] = field(default_factory=list)


class Runtime:
    """Driver + ``ControlLoop`` + recorder, fed from the database; see the module docstring."""

    def __init__(
        self,
        settings: Settings,
        session_factory: sessionmaker[Session],
        cluster: ClusterSpec,
        *,
        policy: str = "has",
        driver_factory: DriverFactory = sim_driver_factory,
        poll_s: float = 0.2,
        schedule_every_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self._factory = session_factory
        self._config_cluster = cluster
        self._policy_name = policy
        self._driver_factory = driver_factory
        self._poll_s = poll_s
        self._schedule_every_s = schedule_every_s
        self.driver: Driver | None = None
        self.loop: ControlLoop | None = None
        self.estimator: StepTimeEstimator | None = None
        """The step-time estimator the policy plans with (``Settings.step_correction``)."""
        self.source: DbJobSource | None = None
        self.stats = RuntimeStats()

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Build the driver and the loop, record the nodes, recover, start the loop."""
        self.driver = self._driver_factory(self._config_cluster)
        recorder = EventRecorder(self._factory)
        listeners: list[Callable[[JobEvent], None]] = [recorder]
        mode = self.settings.step_correction
        if mode == "on" or (mode == "auto" and self.driver.measures_step_times):
            self.estimator = StepTimeEstimator()
        perf = AnalyticalPerfModel()
        policy = estimating_policy(self._policy_name, perf, self.estimator)
        if self.estimator is not None:
            listeners.append(EstimatorFeed(self.estimator, perf, self._live_view,
                                           self.driver.backend.inventory))
        self.source = DbJobSource(self._factory, max_pipeline=self.driver.max_pipeline,
                                  ranking_note=ranking_note(policy),
                                  max_owner_gpus=self.settings.quota_max_gpus,
                                  max_gpus=self.settings.max_gpus,
                                  ranking=self.settings.ranking)
        self.loop = ControlLoop(
            policy, self.driver.backend, self.source,
            self.driver.clock, listeners=listeners,
            alert_listeners=[AlertRecorder(self._factory)], tick_s=self._schedule_every_s,
            poll_s=self._poll_s, around_turn=recorder.batched,
            on_inventory=self._record_nodes, on_policy_notes=self._record_notes,
        )
        cluster = self.loop.controller.cluster
        self._record_nodes(cluster)
        with self.loop.lock:
            self.recover()
        self.loop.start()
        watch_loop(self.loop)
        log.info("runtime started: %d nodes, %d GPUs, policy %s, step-time correction %s",
                 len(cluster.nodes), cluster.total_gpus, self._policy_name,
                 "on" if self.estimator is not None else "off")

    def _live_view(self, job_id: str) -> JobView | None:
        """The view the Controller holds of a live job (the estimator's feed reads it)."""
        rec = self.controller.live.get(job_id) if self.loop is not None else None
        return rec.view if rec is not None else None

    def stop(self) -> None:
        if self.loop is not None:
            watch_loop(None)
            self.loop.stop(timeout_s=10)
        if self.driver is not None:
            self.driver.close()

    def wake(self) -> None:
        """Run the loop now (a submission or cancellation just committed)."""
        if self.loop is not None:
            self.loop.wake()

    @property
    def runner(self) -> WakeRunner:
        return WakeRunner(self.wake)

    @property
    def controller(self) -> Controller:
        return self._loop().controller

    @property
    def lock(self) -> threading.RLock:
        return self._loop().lock

    def cluster_view(self) -> ClusterView:
        """The Controller's own view: free GPUs and who holds them (for ``/v1/cluster``)."""
        ctl = self.controller
        with self.lock:
            state = ctl.cluster
            allocs = {r.view.id: r.allocation.placement for r in ctl.live.values()
                      if r.allocation is not None}
        return ClusterView(state=state, allocations=allocs)

    def step(self) -> None:
        """One loop turn, inline (tests drive the loop this way when it is not started)."""
        self._loop().step()

    # -- recovery ----------------------------------------------------------------------------
    def recover(self) -> None:
        """Hand every live job of the database back to the Controller (see module doc)."""
        ctl = self.controller
        source = self.source
        driver = self.driver
        assert source is not None and driver is not None
        with self._factory() as session:
            live = repo.live_jobs(session=session, with_plans=True)
            notes = [PolicyNote(j.id, j.policy_state) for j in live if j.policy_state]
            past = session.execute(
                sa.select(Job.id, Job.policy_state)
                .where(Job.state.in_(TERMINAL), Job.policy_state.is_not(None))
                .order_by(Job.created_at.desc()).limit(RESTORE_HISTORY)).all()
            notes += [PolicyNote(i, d) for i, d in reversed(past) if d]
            held: dict[str, list[tuple[str, int]]] = {}
            for row in repo.active_allocations(session=session):
                held.setdefault(row.job_id, []).append((row.node_id, row.gpus))
        with ctl.batch():
            for job in live:
                source.note_created(job.created_at)
                placement = held.get(job.id, [])
                resume = float(job.steps_done)
                if job.state.holds_gpus:
                    resume = driver.resume_step(job.id, resume, entrypoint=bool(job.entrypoint))
                    self._requeue_in_db(job, placement, resume)
                view = source.view(job)
                if view is None:
                    continue
                if view.steps_done != resume:
                    view = replace(view, steps_done=resume)
                ctl.submit(view)
                if not job.state.holds_gpus:
                    self.stats.recovered_pending += 1
                    continue
                self.stats.recovered_requeued += 1
                if placement and job.chosen_plan_rank and self._restart_on(view, job,
                                                                              placement):
                    self.stats.recovered_reattached += 1
            # before the batch's scheduling round: admitted jobs keep their admission
            self._loop().restore(notes)
            self.stats.restored_notes = len(notes)
        log.info("recovered %d live jobs: %d pending, %d requeued (%d back on their GPUs)",
                 len(live), self.stats.recovered_pending, self.stats.recovered_requeued,
                 self.stats.recovered_reattached)

    def _requeue_in_db(self, job: Job, placement: list[tuple[str, int]], resume: float) -> None:
        """Back to PENDING (GPUs released) at ``resume``, the step it restarts from."""
        where = ", ".join(f"{g}@{n}" for n, g in placement) or "no GPUs"
        with write_session(self._factory) as session:
            row = repo.get_job(session=session, job_id=job.id, for_update=True)
            if row is None or row.state.terminal:
                return
            now = utcnow()
            progress = row.steps_done
            repo.record_progress(session=session, job=row, steps_done=resume, now=now)
            repo.transition_job(
                session=session, job=row, to=JobState.PENDING, now=now,
                reason=f"service restarted: requeued from its last checkpoint at step "
                       f"{resume:.0f} (progress was {progress:.0f}; held {where})",
                kind="requeued", data={"steps_done": resume, "progress": progress},
            )

    def _restart_on(self, view: JobView, job: Job, placement: list[tuple[str, int]]) -> bool:
        """Start ``view`` again on its old placement if the plan and the GPUs are there (the
        plan is the stored one of the rank it ran: the same plans as at submission)."""
        ctl = self.controller
        plan = next((p for p in view.plans if p.rank == job.chosen_plan_rank), None)
        if plan is None or plan.num_gpus != sum(g for _, g in placement):
            return False
        alloc = Allocation(job_id=view.id, plan=plan, placement=tuple(placement))
        try:
            ctl.cluster.allocate(alloc)
        except (CapacityError, KeyError, ValueError) as exc:
            log.info("job %s cannot go back on %s: %s", view.id, placement, exc)
            return False
        try:
            ctl.apply([start_decision(alloc, "service restarted: resumed on the GPUs it held")])
        except (ControllerError, CapacityError, RuntimeError) as exc:
            log.warning("job %s not restarted on its old GPUs: %s", view.id, exc)
            return False
        return True

    def _record_notes(self, notes: list[PolicyNote]) -> None:
        """Store the policy's notes with their jobs (read back by ``recover``)."""
        with write_session(self._factory) as session:
            for n in notes:
                session.execute(sa.update(Job).where(Job.id == n.job_id)
                                .values(policy_state=dict(n.data)))

    # -- nodes -------------------------------------------------------------------------------
    def _record_nodes(self, cluster: ClusterState) -> None:
        """Make the ``nodes`` table the cluster the backend reports: upsert those present,
        mark the others not alive (their history stays)."""
        now = utcnow()
        ids = {n.id for n in cluster.nodes}
        with write_session(self._factory) as session:
            for n in cluster.nodes:
                repo.upsert_node(
                    session=session, node_id=n.id, gpu_type=n.gpu_type, gpu_memory=n.gpu_memory,
                    total_gpus=n.total_gpus, now=now, interconnect=n.interconnect,
                    intra_bw_gbs=n.intra_bw_gbs,
                )
            session.execute(
                sa.update(NodeRow).where(NodeRow.id.not_in(ids)).values(alive=False,
                                                                         updated_at=now)
            )
        log.info("nodes: %s", ", ".join(f"{n.id}={n.total_gpus}x{n.gpu_type}"
                                        for n in cluster.nodes) or "none")

    def _loop(self) -> ControlLoop:
        if self.loop is None:
            raise RuntimeError("runtime not started")
        return self.loop

    @contextlib.contextmanager
    def locked(self) -> Iterator[Controller]:
        """The Controller, under the loop's lock (tests, admin tools)."""
        with self.lock:
            yield self.controller


__all__ = [
    "AlertRecorder",
    "DbJobSource",
    "Driver",
    "DriverFactory",
    "Runtime",
    "SimDriver",
    "WakeRunner",
    "epoch_to_datetime",
    "sim_driver_factory",
    "stored_view",
]
