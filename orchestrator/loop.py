"""``ControlLoop``: the one loop that runs Frenzy — in ``frenzy serve``, in the simulator, in
the tests and in every benchmark.

A turn of the loop, at time ``now`` on its clock:

1. take what its ``JobSource`` has for it: new jobs, each with the ranked plans made once at
   submission (the database in the service, a trace in the simulator, a list in tests), and
   cancellations;
2. let the backend deliver the events due by ``now`` (workers up, progress, finished, lost);
3. stop the jobs whose time RUNNING reached their run-time limit
   (``Controller.enforce_limits``; ``run_virtual`` also wakes at that instant);
4. sync the inventory from the backend: nodes that joined, left or changed (a node that left
   while a job holds GPUs on it stays until the backend reports that job lost);
5. tick the policy when a periodic round is due (or the policy asked to be woken).

All of it runs inside one ``Controller.batch()``, so simultaneous inputs make one scheduling
round, and ``Controller`` applies the decisions through the backend and emits the events to
the listeners. A policy that raises drops its round and falls back (see ``Controller``).

Two ways to drive the same object: ``run_virtual`` jumps a ``VirtualClock`` from one
instant at which something happens to the next (arrival, backend event, tick, wake-up) —
the simulator, deterministic; ``start`` runs turns on a thread every ``poll_s`` of wall time
(or at once after ``wake``) — the service and the Ray tests. ``lock`` guards the Controller
(it is not thread-safe): hold it to read or poke the Controller from another thread.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, TypeVar, runtime_checkable

from orchestrator.backend import Backend, Clock, VirtualClock
from orchestrator.controller import (
    KEPT_FINISHED,
    KEPT_POLICY_CALLS,
    AlertListener,
    Controller,
    ControllerError,
    Listener,
    RetireListener,
)
from orchestrator.oom import MEMORY_FACTOR, memory_factor
from scheduler.cluster import ClusterState
from scheduler.job import JobView
from scheduler.policy import Policy, PolicyNote, restore, take_notes

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Intake:
    """What a ``JobSource`` hands the loop in one turn."""

    jobs: Sequence[JobView] = ()
    """New jobs in arrival order, each with its ranked plans (best first)."""
    cancels: Sequence[tuple[str, str]] = ()
    """(job id, reason) of jobs to cancel."""


@runtime_checkable
class JobSource(Protocol):
    """Where jobs come from: the database (service), a trace (simulator), a list (tests)."""

    def poll(self, now: float, known: Container[str]) -> Intake:
        """Jobs that arrived by ``now`` and cancellations; ``known`` are the ids the loop
        already has (a source that re-reads its store hands each job over once)."""
        ...

    def next_time(self) -> float | None:
        """When the next job arrives, if the source knows (a trace); None otherwise."""
        ...


@runtime_checkable
class DrivenBackend(Backend, Protocol):
    """A ``Backend`` the loop can drive: deliver due events, report the inventory."""

    def poll(self, now: float) -> None:
        """Deliver the events due by ``now`` through the connected sink."""
        ...

    def inventory(self) -> ClusterState:
        """The nodes as the backend sees them now (all GPUs free: the Controller keeps the
        accounting). Returning the same object as last time means: nothing changed."""
        ...

    def next_event_time(self) -> float | None:
        """When the next event is due (virtual-time backends); None when unknown."""
        ...


class ListJobSource:
    """Jobs from a list, each due at its ``submit_time``; more can be added (``submit``,
    ``cancel``) from any thread while the loop runs (tests, benchmarks, trace replay)."""

    def __init__(self, jobs: Sequence[JobView] = ()) -> None:
        self._jobs = sorted(jobs, key=lambda j: (j.submit_time, j.id))
        self._next = 0
        self._lock = threading.Lock()
        self._added: list[JobView] = []
        self._cancels: list[tuple[str, str]] = []

    def submit(self, *jobs: JobView) -> None:
        """Hand ``jobs`` over together at the next turn, whatever their ``submit_time``."""
        with self._lock:
            self._added.extend(jobs)

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> None:
        with self._lock:
            self._cancels.append((job_id, reason))

    def poll(self, now: float, known: Container[str]) -> Intake:
        k = self._next
        while k < len(self._jobs) and self._jobs[k].submit_time <= now:
            k += 1
        due, self._next = self._jobs[self._next:k], k
        if self._added or self._cancels:
            with self._lock:
                due = [*due, *self._added]
                cancels, self._added, self._cancels = self._cancels, [], []
            return Intake(due, cancels)
        return Intake(due)

    def next_time(self) -> float | None:
        if self._added or self._cancels:
            return -math.inf  # due now
        return self._jobs[self._next].submit_time if self._next < len(self._jobs) else None

    @property
    def remaining(self) -> int:
        """Jobs of the list not yet handed over."""
        return len(self._jobs) - self._next + len(self._added)


KEPT_TURNS = 4096
"""Turn durations the loop keeps (``LoopStats.turn_s``): a bounded window."""
TURN_BUCKETS_S: tuple[float, ...] = tuple(round(1e-4 * 1.1 ** k, 7) for k in range(122))
"""Upper bounds of the turn-duration histogram (``LoopStats.turn_hist``): 0.1 ms to about
10 s, 10 % apart, so a quantile read from it is within 10 % of the exact one."""


@dataclass
class LoopStats:
    """What the loop has done (logs, tests, ``frenzy status``)."""

    turns: int = 0
    submitted: int = 0
    cancelled: int = 0
    inventory_changes: int = 0
    errors: int = 0
    """Turns that raised (logged; the loop goes on)."""
    turn_s: deque[float] = field(default_factory=lambda: deque(maxlen=KEPT_TURNS))
    """Wall seconds of the latest ``KEPT_TURNS`` turns."""
    turn_s_sum: float = 0.0
    """Wall seconds of all turns."""
    turn_hist: list[int] = field(default_factory=lambda: [0] * (len(TURN_BUCKETS_S) + 1))
    """Turns by duration: ``turn_hist[i]`` counts those in (``TURN_BUCKETS_S[i-1]``,
    ``TURN_BUCKETS_S[i]``], the last one those beyond (non-cumulative; fixed size)."""

    def record_turn(self, seconds: float) -> None:
        self.turns += 1
        self.turn_s.append(seconds)
        self.turn_s_sum += seconds
        self.turn_hist[bisect.bisect_left(TURN_BUCKETS_S, seconds)] += 1


class ControlLoop:
    """Job source + Controller + backend + inventory sync + ticks; see the module docstring.

    ``tick_s``: periodic scheduling rounds on the loop's clock (None: only on events and
    wake-ups). ``inventory_every_s``: the least time between two inventory reads (0: every
    turn). ``around_turn``: a context entered around each turn's Controller work (the
    service batches its event writes with it). ``on_inventory``: called with the backend's
    nodes whenever they changed (the service records them for the API).
    ``retire_listeners``, ``keep_finished``, ``keep_policy_calls``: what happens to ended
    jobs and how much history the Controller keeps (see ``Controller``).
    ``on_policy_notes``: called after a turn with the notes the policy changed in it
    (``scheduler.policy.PolicyNote``; the service stores them with the jobs and gives them
    back to ``restore`` after a crash).
    """

    def __init__(
        self,
        policy: Policy,
        backend: DrivenBackend,
        source: JobSource,
        clock: Clock,
        *,
        listeners: Sequence[Listener] = (),
        alert_listeners: Sequence[AlertListener] = (),
        fallback: Policy | None = None,
        tick_s: float | None = 1.0,
        inventory_every_s: float = 0.0,
        poll_s: float = 0.05,
        around_turn: Callable[[], AbstractContextManager[object]] | None = None,
        on_inventory: Callable[[ClusterState], None] | None = None,
        retire_listeners: Sequence[RetireListener] = (),
        keep_finished: int | None = KEPT_FINISHED,
        keep_policy_calls: int | None = KEPT_POLICY_CALLS,
        on_policy_notes: Callable[[list[PolicyNote]], None] | None = None,
    ) -> None:
        self.backend = backend
        self.source = source
        self.clock = clock
        self.tick_s = tick_s
        self.inventory_every_s = inventory_every_s
        self.poll_s = poll_s
        self._around_turn = around_turn or contextlib.nullcontext
        self._on_inventory = on_inventory
        self._on_policy_notes = on_policy_notes
        self._inventory = backend.inventory()
        self._leaving: set[str] = set()
        self.controller = Controller(policy, backend, self._inventory, clock,
                                     listeners=listeners, fallback=fallback,
                                     alert_listeners=alert_listeners,
                                     retire_listeners=retire_listeners,
                                     keep_finished=keep_finished,
                                     keep_policy_calls=keep_policy_calls)
        now = clock.now()
        self._next_tick = now + tick_s if tick_s else math.inf
        self._next_inventory = now + inventory_every_s
        self.stats = LoopStats()
        self.lock = threading.RLock()
        self._wakeup = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.stuck: dict[str, str] = {}
        """Why each job still waiting when ``run_virtual`` ended is stuck there: the jobs no
        round will place (job id -> reason; empty when it ended otherwise)."""

    @property
    def policy(self) -> Policy:
        return self.controller.policy

    # -- one turn --------------------------------------------------------------------------
    def step(self, now: float | None = None, *, wake: float | None = None) -> None:
        """One turn at ``now`` (default: the clock's time); ``wake``: the time the policy
        asked to be called at, if it falls in this turn."""
        t0 = time.perf_counter()
        ctl = self.controller
        now = self.clock.now() if now is None else now
        intake = self.source.poll(now, ctl.jobs)  # may read a database: outside the lock
        with self.lock, self._around_turn(), ctl.batch():
            for job in intake.jobs:
                if job.id in ctl.jobs:
                    continue
                ctl.submit(job)
                self.stats.submitted += 1
            for job_id, reason in intake.cancels:
                rec = ctl.jobs.get(job_id)
                if rec is not None and not rec.state.terminal:
                    with contextlib.suppress(ControllerError):
                        ctl.cancel(job_id, reason)
                        self.stats.cancelled += 1
            self.backend.poll(now)
            ctl.enforce_limits(now)
            if now >= self._next_inventory:
                self._next_inventory = now + self.inventory_every_s
                self.sync_inventory()
            if now >= self._next_tick:
                ctl.tick()
                self._next_tick = now + (self.tick_s or math.inf)
            elif wake is not None and wake <= now:
                ctl.tick()
        self.hand_notes()
        self.stats.record_turn(time.perf_counter() - t0)

    # -- policy state across restarts --------------------------------------------------------
    def restore(self, notes: Sequence[PolicyNote]) -> None:
        """Rebuild the policy's state after a restart (``scheduler.policy.restore``) from the
        stored ``notes`` and the jobs the Controller holds now; call it once the recovered
        jobs are submitted and before the first scheduling round (inside the recovery's
        ``Controller.batch()``)."""
        with self.lock:
            restore(self.policy, [r.view for r in self.controller.live.values()], notes)

    def hand_notes(self) -> None:
        """Pass the notes the policy changed to ``on_policy_notes`` (taken even without one,
        so a policy's pending notes stay bounded)."""
        with self.lock:
            notes = take_notes(self.policy)
        if notes and self._on_policy_notes is not None:
            self._on_policy_notes(notes)

    def sync_inventory(self) -> None:
        """Read the backend's nodes; reconcile the Controller's cluster if they changed."""
        inv = self.backend.inventory()
        if inv is self._inventory and not self._leaving:
            return
        if inv is not self._inventory and self._on_inventory is not None:
            self._on_inventory(inv)
        self._inventory = inv
        before = self.controller.cluster
        self.controller.sync_nodes(inv.nodes)
        after = self.controller.cluster
        if after is not before:
            self.stats.inventory_changes += 1
        # Nodes gone from the backend but kept while a job still holds GPUs there: looked at
        # again every turn until the backend reports those jobs lost.
        self._leaving = set(after.by_id) - {n.id for n in inv.nodes}

    # -- virtual time (the simulator) --------------------------------------------------------
    def run_virtual(
        self,
        *,
        until_s: float | None = None,
        max_policy_calls: int | None = None,
        on_turn: Callable[[ControlLoop], None] | None = None,
    ) -> None:
        """Jump the ``VirtualClock`` from one instant at which something happens to the
        next and run a turn there, until every job has ended and nothing more will arrive
        (or ``until_s`` / ``max_policy_calls``).

        It also ends when jobs wait that no round will ever place: nothing holds GPUs and
        nothing is due but the periodic tick (no backend event, arrival, run-time limit,
        wake-up, nor a start the policy booked for later, ``Controller.holds_until``), so
        the rounds to come see what the last one saw. One more round gives the policy its
        chance (at the next tick, or at once without ticks); if it places nothing, the
        loop ends and the waiting jobs stay unfinished, each with its reason in ``stuck``."""
        clock = self.clock
        if not isinstance(clock, VirtualClock):
            raise TypeError("run_virtual needs a VirtualClock; use start() for wall time")
        ctl = self.controller
        stuck_ticked = False
        self.stuck = {}
        while True:
            if max_policy_calls is not None and ctl.policy_call_count >= max_policy_calls:
                break
            now = clock.now()
            t_ev = self.backend.next_event_time()
            t_arr = self.source.next_time()
            t = min(math.inf if t_ev is None else t_ev, math.inf if t_arr is None else t_arr)
            t_limit = ctl.next_limit_time()  # a job reaches its run-time limit
            if t_limit is not None:
                t = min(t, max(t_limit, now))
            wake = ctl.wake_at  # the policy asked to be called again then
            if wake is not None and wake > now:
                t = min(t, wake)
            else:
                wake = None
            held = ctl.holds_until  # a start the policy booked for later
            idle = (math.isinf(t) and ctl.active() and (held is None or held <= now)
                    and not ctl.running())
            if self.tick_s and ctl.active():
                t = min(t, self._next_tick)
            if math.isinf(t):
                if ctl.active() and not stuck_ticked:
                    stuck_ticked = True  # one last round: maybe the policy waits for a tick
                    with self.lock:
                        ctl.tick()
                    continue
                self._record_stuck(now)
                break
            if idle:  # only the periodic tick is due: the rounds to come see the same
                if stuck_ticked:
                    self._record_stuck(now)
                    break
                stuck_ticked = True
            else:
                stuck_ticked = False
            if until_s is not None and t > until_s:
                break
            clock.advance_to(max(t, now))
            self.step(t, wake=wake)
            if on_turn is not None:
                on_turn(self)

    def _record_stuck(self, now: float) -> None:
        """Note the waiting jobs no round will place (``stuck``: job id -> reason)."""
        ctl = self.controller
        for view in ctl.pending():
            plans = view.plans
            fewest = min(plans, key=lambda p: (p.num_gpus, p.required_bytes), default=None)
            need = (f"its smallest plan needs {fewest.num_gpus}x{fewest.gpu_type} "
                    f"({fewest.required_bytes / (1 << 30):.3g} GiB each)" if fewest is not None
                    else "it has no plan")
            oom = (f" after an out-of-memory re-plan (memory x{memory_factor(view):.2f})"
                   if MEMORY_FACTOR in view.extra else "")
            self.stuck[view.id] = (
                f"never placed{oom}: at t={now:.0f}s the cluster was idle with nothing more "
                f"to arrive or happen and {ctl.policy.name} placed it in no round; "
                f"{len(plans)} plan(s), {need}")
        if self.stuck:
            log.warning("%s: %d waiting job(s) no round will place (e.g. %s: %s)",
                        ctl.policy.name, len(self.stuck), *next(iter(self.stuck.items())))

    # -- wall time (the service) -------------------------------------------------------------
    def start(self) -> ControlLoop:
        """Run turns on a thread: every ``poll_s``, or at once after ``wake``."""
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="frenzy-loop", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        self._stop.set()
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
            self._thread = None

    def __enter__(self) -> ControlLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def wake(self) -> None:
        """Run a turn now (a submission or cancellation is waiting)."""
        self._wakeup.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wakeup.wait(self.poll_s)
            self._wakeup.clear()
            if self._stop.is_set():
                break
            try:
                wake = self.controller.wake_at
                self.step(wake=wake if wake is not None and wake <= self.clock.now() else None)
            except Exception:
                self.stats.errors += 1
                log.exception("control loop turn failed; continuing")

    def call(self, fn: Callable[[Controller], T]) -> T:
        """``fn(controller)`` under the loop's lock (reads and test pokes from any thread)."""
        with self.lock:
            return fn(self.controller)

    def wait_until(self, pred: Callable[[Controller], bool], timeout_s: float) -> bool:
        """Wait until ``pred(controller)`` holds; without a thread, run turns meanwhile."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._thread is None:
                self.step()
            if self.call(pred):
                return True
            time.sleep(self.poll_s)
        return False
