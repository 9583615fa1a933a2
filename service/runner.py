"""The narrow port between the API and what runs jobs (the orchestrator's Controller).

The API persists a submission first (job PENDING, its ranked plans, a ``submitted`` event)
and only then hands it to a ``JobRunner``; a cancellation is persisted (CANCELLED, with its
reason, GPUs released) and then passed on. What the Controller decides and learns later
reaches the database through ``EventRecorder``, a Controller listener that writes each
``orchestrator.states.JobEvent`` (state, allocation per node, progress) in one transaction,
so state survives a restart and the API reads it from one place.

``PendingRunner`` is the default until the control loop is wired in: jobs stay PENDING.
In ``frenzy serve`` the loop reads submissions from the database itself
(``service.app_runtime``), and the runner only wakes it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.states import IllegalTransition, JobEvent, JobState
from service.db import repositories as repo
from service.db.engine import write_session
from service.db.models import Job
from service.job_memory import predicted_tensors, with_oom, with_peak
from service.job_metrics import appended, metric_window

if TYPE_CHECKING:
    from predictor.plan import Plan
    from predictor.spec import ModelSpec, TrainingSpec

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class SubmittedJob:
    """A stored job as handed to the runner: specs and ranked plans, best first (plan
    ``k`` of ``plans`` is the database's rank ``k + 1``)."""

    id: str
    owner: str
    model: ModelSpec
    train: TrainingSpec
    plans: tuple[Plan, ...]
    submitted_at: datetime
    name: str | None = None
    priority: int = 0
    deadline_at: datetime | None = None
    entrypoint: str | None = None


@runtime_checkable
class JobRunner(Protocol):
    """What the API needs from whatever runs jobs. Both calls must return quickly (enqueue,
    do not run); an error raised by ``submit`` fails the job with the error as its reason."""

    def submit(self, job: SubmittedJob) -> None: ...

    def cancel(self, job_id: str, reason: str) -> None: ...


@dataclass
class PendingRunner:
    """Runs nothing: submitted jobs stay PENDING (tests, API-only deployments)."""

    nonblocking = True
    """``submit``/``cancel`` only take a short lock: the API may call them on its event loop."""

    submitted: list[str] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def submit(self, job: SubmittedJob) -> None:
        with self._lock:
            self.submitted.append(job.id)
        log.debug("job %s stays PENDING (no controller attached)", job.id)

    def cancel(self, job_id: str, reason: str) -> None:
        with self._lock:
            self.cancelled.append(job_id)
        log.debug("job %s cancelled: %s", job_id, reason)


def epoch_to_datetime(seconds: float) -> datetime:
    """The Controller's wall-clock seconds as an aware UTC datetime."""
    return datetime.fromtimestamp(seconds, UTC)


MAX_HOLD_S = 0.005
"""How long one transaction of the Controller's events may run before it ends after its
current event (``EventRecorder``): the API's submissions wait for the SQLite writer lock
meanwhile, and one of theirs takes ~1 ms."""


class EventRecorder:
    """Persists the Controller's ``JobEvent`` values: ``controller.subscribe(recorder)``.

    * the submission event (``from_state`` None) is skipped: the API stored the job;
    * progress (RUNNING → RUNNING, reason ``progress``) updates ``steps_done`` only (and
      ``running_s``, the time spent running, for a job with a run-time limit);
    * an event carrying an allocation that differs from the stored one replaces the
      job's allocation rows (one per node) and records the plan rank being run;
    * a state change is applied through the state machine; one it forbids (e.g. a late
      report after the user cancelled) is logged as an event and the state is kept.
    """

    def __init__(
        self,
        session_factory: sessionmaker[Session],
        to_datetime: Callable[[float], datetime] = epoch_to_datetime,
        max_events_per_transaction: int = 8,
        max_hold_s: float = MAX_HOLD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = session_factory
        self._to_datetime = to_datetime
        self._buffer: list[JobEvent] | None = None
        self._chunk = max(1, max_events_per_transaction)
        """A batch is written in transactions of at most this many events: on SQLite every
        other writer (the API's submissions) waits while one runs, so a long batch is cut
        into short turns they can slip between (~6 ms per event on a loaded machine)."""
        self._max_hold_s = max_hold_s
        """A transaction also ends after the event that took it past this long (``clock``
        seconds since it began): on a loaded machine a few events can hold the writer lock
        for tens of milliseconds. The rows written and their order stay the same; only
        their split into transactions changes."""
        self._clock = clock

    def __call__(self, event: JobEvent) -> None:
        if event.from_state is None:
            return  # the submission: the API stored the job
        if self._buffer is not None:
            self._buffer.append(event)
            return
        with write_session(self._factory) as session:
            self.apply(session=session, event=event)

    @contextlib.contextmanager
    def batched(self) -> Iterator[None]:
        """Events emitted inside the block are written at its end, in order, a few per
        transaction (``max_events_per_transaction``, each transaction ending early after
        ``max_hold_s``; one writer turn for several events instead of one per event). Call
        it from the one thread that drives the Controller, under its lock. If a
        transaction fails, its events are written one by one."""
        if self._buffer is not None:  # nested: the outer block writes
            yield
            return
        self._buffer = []
        try:
            yield
        finally:
            events, self._buffer = self._buffer, None
            k = 0
            while k < len(events):
                k += self._write_all(events[k:k + self._chunk])

    def _write_all(self, events: list[JobEvent]) -> int:
        """Write ``events`` in order in one transaction, ending it early after the event
        that took it past ``max_hold_s``; how many were written (at least one)."""
        try:
            with write_session(self._factory) as session:
                began = self._clock()
                # The batch's jobs in one locked read, not one per event: on SQLite every
                # writer (the API's submissions too) waits while this transaction runs.
                jobs = _jobs_for_update(session, {e.job_id for e in events
                                                  if e.from_state is not None})
                for done, event in enumerate(events, start=1):
                    self.apply(session=session, event=event, job=jobs.get(event.job_id))
                    session.flush()
                    if done < len(events) and self._clock() - began >= self._max_hold_s:
                        return done  # committed on leaving the block; the rest in turn
                return len(events)
        except Exception:
            log.exception("writing %d events in one transaction failed; one by one",
                          len(events))
            for event in events:
                try:
                    self(event)
                except Exception:
                    log.exception("event %s of job %s not recorded", event.reason,
                                  event.job_id)
            return len(events)

    @staticmethod
    def _record_window(job: Job, event: JobEvent, now: datetime) -> None:
        """Append the progress report's step window to ``job.metrics`` (bounded)."""
        plan = event.allocation.plan if event.allocation is not None else None
        window = metric_window(
            at=now.isoformat(), data=event.data, training=job.training or {},
            predicted_step_time_s=getattr(plan, "step_time_s", None),
            predicted_memory_bytes=None if plan is None else predicted_tensors(
                plan, cuda=event.data.get("peak_reserved_bytes") is not None))
        if window is not None:
            job.metrics = appended(job.metrics, window)

    @staticmethod
    def _record_memory(job: Job, event: JobEvent, now: datetime) -> None:
        """A measured peak (progress) or an out-of-memory re-plan into ``job.memory``."""
        data = event.data
        peak = data.get("peak_tensors_bytes")
        if isinstance(peak, int):
            reserved = data.get("peak_reserved_bytes")
            plan = event.allocation.plan if event.allocation is not None else None
            spec = job.model_spec if isinstance(job.model_spec, dict) else {}
            job.memory = with_peak(job.memory, plan=plan, tensors_bytes=peak,
                                   reserved_bytes=reserved if isinstance(reserved, int) else None,
                                   at=now.isoformat(), family=spec.get("family"))
        held, factor = data.get("held_bytes"), data.get("memory_factor")
        if isinstance(held, int) and isinstance(factor, float):
            cap = data.get("cap_bytes")
            job.memory = with_oom(job.memory, held_bytes=held,
                                  cap_bytes=cap if isinstance(cap, int) else 0,
                                  memory_factor=factor, at=now.isoformat())

    def apply(self, *, session: Session, event: JobEvent, job: Job | None = None) -> None:
        """Write one event inside the caller's transaction (``job``: its row, already
        read for update in this transaction; else it is read here)."""
        if event.from_state is None:
            return
        if job is None or job.id != event.job_id:
            job = repo.get_job(session=session, job_id=event.job_id, for_update=True)
        if job is None:
            log.warning("event %s for unknown job %s dropped", event.reason, event.job_id)
            return
        now = self._to_datetime(event.time)
        data = {k: v for k, v in event.data.items() if _jsonable(v)}
        fresh = data.pop("replanned_plans", None)  # planned again after running out of memory
        if isinstance(fresh, list):
            job.plans = fresh
        steps = event.data.get("steps_done")
        if isinstance(steps, int | float):
            repo.record_progress(session=session, job=job, steps_done=float(steps), now=now)
        ran = event.data.get("running_s")  # jobs with a run-time limit (orchestrator.quotas)
        if isinstance(ran, int | float) and not isinstance(ran, bool):
            job.running_s = max(float(job.running_s or 0.0), float(ran))
        same_state = event.to_state is job.state
        self._record_memory(job, event, now)
        if same_state and event.reason == "progress":
            self._record_window(job, event, now)
            return
        if same_state and job.state.terminal:
            return  # the API recorded this already (e.g. its own cancellation)
        alloc = event.allocation
        if alloc is not None and event.to_state.holds_gpus and not job.state.terminal:
            placement = [(node, gpus) for node, gpus in alloc.placement]
            data["placement"] = [[node, gpus] for node, gpus in placement]
            if _held(session, job.id) != sorted(placement):
                repo.set_allocation(
                    session=session, job=job, placement=placement,
                    gpu_type=alloc.plan.gpu_type, plan_rank=alloc.plan.rank or None, now=now,
                )
        if not same_state:
            try:
                repo.transition_job(
                    session=session, job=job, to=event.to_state, reason=event.reason,
                    now=now, data=data or None,
                )
                return
            except IllegalTransition as exc:
                log.warning("job %s: %s; state kept", job.id, exc)
                data["ignored_transition"] = str(exc)
        repo.append_event(
            session=session, job_id=job.id, kind=event.to_state.value, message=event.reason,
            state=job.state.value, data=data or None, now=now,
        )


def _jobs_for_update(session: Session, ids: set[str]) -> dict[str, Job]:
    """The rows of ``ids`` read (and locked, on PostgreSQL) in one statement."""
    found: dict[str, Job] = {}
    ordered = sorted(ids)  # one lock order for every writer
    for k in range(0, len(ordered), 500):
        stmt = sa.select(Job).where(Job.id.in_(ordered[k:k + 500])).order_by(Job.id)
        for job in session.scalars(stmt.with_for_update()):
            found[job.id] = job
    return found


def _held(session: Session, job_id: str) -> list[tuple[str, int]]:
    return sorted((a.node_id, a.gpus) for a in repo.active_allocations(session=session,
                                                                         job_id=job_id))


def _jsonable(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool | list | dict)


def specs_of(job: Job) -> tuple[ModelSpec, TrainingSpec]:
    """Rebuild a stored job's specs."""
    from predictor.spec import ModelSpec, TrainingSpec

    return ModelSpec(**job.model_spec), TrainingSpec(**job.training)


def resume_view(session: Session) -> list[tuple[Job, Sequence[tuple[str, int]]]]:
    """Live jobs, oldest first, with the GPUs each holds per node: what a restarted
    Controller re-attaches (held) or re-queues (none)."""
    held: dict[str, list[tuple[str, int]]] = {}
    for row in repo.active_allocations(session=session):
        held.setdefault(row.job_id, []).append((row.node_id, row.gpus))
    return [(job, held.get(job.id, [])) for job in repo.live_jobs(session=session)]


__all__ = [
    "EventRecorder",
    "JobRunner",
    "JobState",
    "PendingRunner",
    "SubmittedJob",
    "epoch_to_datetime",
    "resume_view",
    "specs_of",
]
