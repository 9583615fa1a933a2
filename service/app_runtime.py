"""The running service's control side: one Controller, fed from the database.

``Runtime`` owns the Controller, its backend (through a ``Driver``), the ``EventRecorder``
that writes every job event to the database, one lock around all of them (the Controller is
not thread-safe) and one loop thread that

* takes new submissions from the database (the API only writes rows: the database *is* the
  queue, so any number of API worker processes can accept jobs and a crash between "row
  written" and "scheduler told" loses nothing),
* passes cancellations recorded by the API on to the Controller,
* pumps the backend (due events, progress) and runs a scheduling round every
  ``schedule_every_s``.

Restart safety (``recover``): on start, every live job in the database is handed back to the
Controller. A job that held GPUs is first recorded as requeued (its GPUs released) at the
step the driver says it resumes from (``Driver.resume_step``: its last checkpoint on Ray,
not the last progress written, which may be ahead of it), then started again on the same
placement when those nodes still have room, and otherwise left in the queue for the policy.
Its old workers are gone: an emulated Ray cluster dies with the service, and on a long-lived
one Ray kills the actors and removes the placement groups of a dead driver. Pending jobs are
queued again in their original order. So the database and the Controller agree on every GPU
before the first request is served.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.backend import Backend, Clock, Progress, VirtualClock
from orchestrator.controller import Controller, ControllerError
from orchestrator.states import JobState
from scheduler.cluster import Allocation, CapacityError, ClusterState
from scheduler.decision import start as start_decision
from scheduler.job import JobView
from scheduler.policy import make_policy
from service.api.errors import ApiError
from service.api.inventory import ClusterView, Inventory
from service.api.planning import Planned, PlanningService, default_planner
from service.db import repositories as repo
from service.db.engine import write_session
from service.db.models import Job, NodeRow, utcnow
from service.runner import EventRecorder, SubmittedJob, epoch_to_datetime
from service.schemas import JobCreate
from service.settings import Settings

if TYPE_CHECKING:
    from orchestrator.clusters import ClusterSpec

log = logging.getLogger(__name__)

INGEST_SLACK = timedelta(seconds=30)
"""Rows are picked up by ``created_at`` / ``finished_at`` ≥ (newest seen − slack): a
transaction that stamped its row earlier but committed later is still seen."""


class Driver(Protocol):
    """A backend and what the runtime's loop must do to drive it.

    ``inventory`` is the cluster as the backend sees it (Ray's nodes, or the emulated ones);
    ``pump`` is called under the Controller's lock on every loop turn to deliver the
    backend's due events; ``close`` releases what the backend started.
    """

    backend: Backend
    clock: Clock
    max_pipeline: int | None
    """Deepest pipeline the backend's built-in trainer runs (None: any); plans beyond it are
    kept away from the scheduler unless the job brings its own entrypoint."""

    def inventory(self) -> ClusterState: ...

    def pump(self, controller: Controller) -> None: ...

    def resume_step(self, job_id: str, steps_done: float, *, entrypoint: bool) -> float:
        """Where a job that held GPUs when the service died resumes, given the last progress
        recorded (``steps_done``): its newest checkpoint where the backend keeps them."""
        ...

    def close(self) -> None: ...


DriverFactory = Callable[["ClusterSpec"], Driver]
"""Builds a ``Driver`` for the cluster described in ``config/`` (the Ray one starts an
emulated Ray cluster from it, or joins ``RAY_ADDRESS`` and reads the nodes from Ray)."""


class WallClockVirtual(VirtualClock):
    """A ``VirtualClock`` that ``SimDriver`` moves to wall time on every pump."""

    def __init__(self) -> None:
        super().__init__(time.time())

    def catch_up(self) -> float:
        now = max(self.now(), time.time())
        self.advance_to(now)
        return now


class SimDriver:
    """``SimBackend`` in wall time: jobs "run" at their predicted speed, nothing trains.

    For API-only deployments, load tests and machines without Ray. Progress is reported
    every ``progress_every_s`` so the database and the dashboard move.
    """

    max_pipeline: int | None = None  # simulated jobs run any plan

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

        self.clock = WallClockVirtual()
        self._cluster = cluster
        self.backend = SimBackend(
            self.clock, AnalyticalPerfModel(), cluster, launch_delay_s=launch_delay_s,
            restart_delay_s=restart_delay_s,
        )
        self._progress_every = progress_every_s
        self._last_progress = 0.0

    def inventory(self) -> ClusterState:
        return self._cluster

    def pump(self, controller: Controller) -> None:
        now = self.clock.catch_up()
        due = self.backend.pop_due(now)
        if due:
            with controller.batch():
                self.backend.deliver(due)
        if now - self._last_progress >= self._progress_every:
            self._last_progress = now
            for rec in list(controller.jobs.values()):
                if rec.state is JobState.RUNNING:
                    controller.on_event(
                        Progress(rec.view.id, now, self.backend.steps_done(rec.view.id))
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
    """The API's ``JobRunner`` when the Controller reads the database: nothing to hand over,
    only a nudge so a new job is picked up at once rather than at the next poll."""

    nonblocking = True

    def __init__(self, wake: Callable[[], None] | None = None) -> None:
        self._wake = wake

    def submit(self, job: SubmittedJob) -> None:
        if self._wake is not None:
            self._wake()

    def cancel(self, job_id: str, reason: str) -> None:
        if self._wake is not None:
            self._wake()


@dataclass
class RuntimeStats:
    """What the loop has done (for logs, tests and ``frenzy status``)."""

    ingested: int = 0
    recovered_requeued: int = 0
    recovered_reattached: int = 0
    recovered_pending: int = 0
    cancelled: int = 0
    loop_errors: int = 0
    placement_latency_s: list[float] = field(default_factory=list)


class Runtime:
    """Controller + backend + recorder + lock + loop thread; see the module docstring."""

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
        self.lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.driver: Driver | None = None
        self.controller: Controller | None = None
        self.stats = RuntimeStats()
        self._planning = PlanningService(
            default_planner, cache_size=settings.plan_cache_size,
            default_max_gpus=settings.max_gpus, default_ranking=settings.ranking,
            max_plans=settings.max_plans_per_job,
        )
        self._inventory = Inventory(total_by_type={})
        self._seen_created: datetime | None = None
        self._seen_finished: datetime | None = None
        self._last_schedule = 0.0
        self._recorder: EventRecorder | None = None
        self._planned: OrderedDict[str, Planned] = OrderedDict()

    # -- life cycle --------------------------------------------------------------------------
    def start(self) -> None:
        """Build the driver and Controller, record the nodes, recover, start the loop."""
        self.driver = self._driver_factory(self._config_cluster)
        cluster = self.driver.inventory()
        self._inventory = Inventory(total_by_type=cluster.total_by_type())
        self._record_nodes(cluster)
        policy = make_policy(self._policy_name)
        recorder = self._recorder = EventRecorder(self._factory)
        self.controller = Controller(policy, self.driver.backend, cluster, self.driver.clock,
                                     listeners=[recorder])
        with self.lock:
            self.recover()
        self._thread = threading.Thread(target=self._loop, name="frenzy-runtime", daemon=True)
        self._thread.start()
        log.info("runtime started: %d nodes, %d GPUs, policy %s", len(cluster.nodes),
                 cluster.total_gpus, self._policy_name)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.driver is not None:
            self.driver.close()

    def wake(self) -> None:
        """Run the loop now (a submission or cancellation just committed)."""
        self._wake.set()

    @property
    def runner(self) -> WakeRunner:
        return WakeRunner(self.wake)

    def cluster_view(self) -> ClusterView:
        """The Controller's own view: free GPUs and who holds them (for ``/v1/cluster``)."""
        ctl = self._ctl()
        with self.lock:
            state = ctl.cluster
            allocs = {r.view.id: r.allocation.placement for r in ctl.jobs.values()
                      if r.allocation is not None}
        return ClusterView(state=state, allocations=allocs)

    # -- recovery ----------------------------------------------------------------------------
    def recover(self) -> None:
        """Hand every live job of the database back to the Controller (see module doc)."""
        ctl = self._ctl()
        with self._factory() as session:
            live = repo.live_jobs(session=session)
            held: dict[str, list[tuple[str, int]]] = {}
            for row in repo.active_allocations(session=session):
                held.setdefault(row.job_id, []).append((row.node_id, row.gpus))
        driver = self.driver
        assert driver is not None
        with ctl.batch():
            for job in live:
                self._note_created(job.created_at)
                placement = held.get(job.id, [])
                resume = float(job.steps_done)
                if job.state.holds_gpus:
                    resume = driver.resume_step(job.id, resume, entrypoint=bool(job.entrypoint))
                    self._requeue_in_db(job, placement, resume)
                view = self._view_of(job)
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
        """Start ``view`` again on its old placement if the plan and the GPUs are there."""
        ctl = self._ctl()
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

    # -- the loop ----------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._poll_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.step()
            except Exception:
                self.stats.loop_errors += 1
                log.exception("runtime loop turn failed; continuing")

    def step(self) -> None:
        """One loop turn: ingest, cancel, pump, maybe schedule."""
        ctl = self._ctl()
        new, cancelled = self._poll_db()
        batched = (self._recorder.batched() if self._recorder is not None
                   else contextlib.nullcontext())
        # The recorder's batch encloses the Controller's: the scheduling round the latter
        # runs at its end emits into the former, and the whole turn is one transaction.
        with self.lock, batched, ctl.batch():
            for view in new:
                if view.id not in ctl.jobs:
                    ctl.submit(view)
                    self.stats.ingested += 1
            for job_id, reason in cancelled:
                rec = ctl.jobs.get(job_id)
                if rec is not None and not rec.state.terminal:
                    with contextlib.suppress(ControllerError):
                        ctl.cancel(job_id, reason)
                        self.stats.cancelled += 1
            assert self.driver is not None
            self.driver.pump(ctl)
            now = time.monotonic()
            if now - self._last_schedule >= self._schedule_every_s:
                self._last_schedule = now
                ctl.tick()

    def _poll_db(self) -> tuple[list[JobView], list[tuple[str, str]]]:
        ctl = self._ctl()
        known = set(ctl.jobs)
        with self._factory() as session:
            # Ids first (cheap), whole rows only for jobs the Controller does not know yet.
            stmt = sa.select(Job.id).where(Job.state == JobState.PENDING)
            if self._seen_created is not None:
                stmt = stmt.where(Job.created_at >= self._seen_created - INGEST_SLACK)
            unknown = [i for i in session.scalars(stmt) if i not in known]
            fresh: list[Job] = []
            for k in range(0, len(unknown), 500):
                fresh.extend(session.scalars(
                    sa.select(Job).where(Job.id.in_(unknown[k:k + 500]))))
            fresh.sort(key=lambda j: (j.created_at, j.id))
            # Jobs the API ended (cancelled, or failed when the runner refused them); the
            # Controller's own endings are already terminal in it.
            cstmt = sa.select(Job.id, Job.state_reason, Job.finished_at).where(
                Job.state.in_((JobState.CANCELLED, JobState.FAILED)),
                Job.finished_at.is_not(None))
            if self._seen_finished is not None:
                cstmt = cstmt.where(Job.finished_at >= self._seen_finished - INGEST_SLACK)
            ended = session.execute(cstmt).all()
        views = []
        for job in fresh:
            self._note_created(job.created_at)
            view = self._view_of(job)
            if view is not None:
                views.append(view)
        cancelled = []
        for job_id, reason, finished in ended:
            if self._seen_finished is None or finished > self._seen_finished:
                self._seen_finished = finished
            rec = ctl.jobs.get(job_id)
            if rec is not None and not rec.state.terminal:
                cancelled.append((job_id, reason or "cancelled"))
        return views, cancelled

    def _note_created(self, at: datetime) -> None:
        if self._seen_created is None or at > self._seen_created:
            self._seen_created = at

    def _view_of(self, job: Job) -> JobView | None:
        """The Controller's view of a stored job; plans again from the (cached) planner.

        A job whose request no longer plans on this cluster (GPU types changed) is failed
        with the planner's reason."""
        try:
            planned = self._planned.get(job.request_hash)
            if planned is None:
                body = JobCreate.model_validate(job.request)
                planned = self._planning.plan(body, self._inventory)
                self._planned[job.request_hash] = planned
                while len(self._planned) > max(1, self.settings.plan_cache_size):
                    self._planned.popitem(last=False)
        except (ApiError, ValueError) as exc:
            reason = exc.message if isinstance(exc, ApiError) else str(exc)
            self._fail(job.id, f"cannot be planned on this cluster: {reason}")
            return None
        plans = planned.plans
        limit = getattr(self.driver, "max_pipeline", None)
        if limit is not None and not job.entrypoint:
            plans = tuple(p for p in plans if p.parallel.pp <= limit)
            if not plans:
                self._fail(job.id, f"every plan of this job needs pipeline parallelism "
                                   f"(pp > {limit}), which the built-in trainer does not run; "
                                   "give an entrypoint script, more GPUs or a smaller model")
                return None
        return JobView(
            id=job.id, submit_time=job.created_at.timestamp(), plans=plans,
            total_steps=int(job.total_steps), model=planned.model, train=planned.train,
            steps_done=float(job.steps_done),
            deadline=job.deadline_at.timestamp() if job.deadline_at else None,
            priority=job.priority,
            extra={"entrypoint": job.entrypoint} if job.entrypoint else {},
        )

    def _fail(self, job_id: str, reason: str) -> None:
        with write_session(self._factory) as session:
            row = repo.get_job(session=session, job_id=job_id, for_update=True)
            if row is not None and not row.state.terminal:
                repo.transition_job(session=session, job=row, to=JobState.FAILED,
                                    reason=reason, now=utcnow())
        log.warning("job %s failed: %s", job_id, reason)

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

    def _ctl(self) -> Controller:
        if self.controller is None:
            raise RuntimeError("runtime not started")
        return self.controller

    @contextlib.contextmanager
    def locked(self) -> Iterator[Controller]:
        """The Controller, under the runtime's lock (tests, admin tools)."""
        with self.lock:
            yield self._ctl()


__all__ = [
    "Driver",
    "DriverFactory",
    "Runtime",
    "SimDriver",
    "WakeRunner",
    "epoch_to_datetime",
    "sim_driver_factory",
]
