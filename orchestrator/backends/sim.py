"""``SimBackend``: runs jobs on a virtual clock, at the speed the performance model predicts.

A job started at ``t`` on an allocation begins making steps after a launch delay (plus a
checkpoint-restore delay when it resumes from a checkpoint) and then makes one step every
``step_time`` seconds, where ``step_time`` is its plan re-timed for the placement it actually
got (``PerfModel.placed_plan``). Its finish is therefore

    finish = t + delay + remaining_steps × step_time

Stopping or resizing a job accounts the steps made so far (the checkpoint is taken at the
stop; its cost is charged as the restore delay of the next launch). Events wait in a heap
keyed by time; ``poll(now)`` delivers those due to the controller's sink. A generation
counter per job makes events of a superseded launch harmless.

Nodes can join and leave (``add_node`` / ``remove_node``): the next ``inventory`` shows it,
and a job running on a node that left is reported ``Preempted`` at the steps it had made.
With ``progress_every_s`` set (the service's wall-time simulation, and the simulator under
prediction error), ``poll`` also reports the progress of every running job that often, so the
database and the dashboard move and an online estimator can observe step times.

Prediction error (``step_factor`` / ``memory_factor``, see ``simulator.error``): a job then
runs at ``step_time × step_factor(job id, GPU type)`` instead of the predicted step time, and
its true peak memory is the predicted peak × ``memory_factor(job id)``. Only the backend knows
these factors: the controller and the policy see the plans (predictions), the progress and the
finish, as they would on real GPUs. A launch whose true peak exceeds its GPU's memory fails at
its first step with ``OutOfMemory`` (the controller re-plans the job, ``orchestrator.oom``)
and is counted in ``over_memory``.
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

from orchestrator.backend import (
    BackendEvent,
    Clock,
    EventSink,
    Finished,
    OutOfMemory,
    Preempted,
    Progress,
    Started,
)
from predictor.gpus import get_gpu
from predictor.plan import Plan
from scheduler.cluster import Allocation, ClusterState, Node
from scheduler.job import JobView
from scheduler.policy import PerfModel

log = logging.getLogger(__name__)

DEFAULT_LAUNCH_DELAY_S = 10.0
"""Workers scheduled and the first step begun (container start, NCCL init, data loader)."""

DEFAULT_RESTART_DELAY_S = 60.0
"""Extra cost of resuming from a checkpoint: save on stop plus load on start."""


@dataclass(slots=True)
class _Run:
    """One launch of one job on one allocation."""

    job: JobView
    allocation: Allocation
    placed: Plan
    gen: int
    launched_at: float
    steps_from: float  # steps done when the launch began
    run_start: float  # when steps start accruing (launch + delays)
    step_time: float  # true seconds per step (the placed prediction × the error factor)

    def steps_at(self, t: float) -> float:
        if t <= self.run_start:
            return self.steps_from
        done = self.steps_from + (t - self.run_start) / self.step_time
        return min(float(self.job.total_steps), done)

    @property
    def finish_time(self) -> float:
        return self.run_start + max(0.0, self.job.total_steps - self.steps_from) * self.step_time


class SimBackend:
    """Virtual-clock backend; see the module docstring for the progress model.

    ``topology`` is the cluster the jobs run on; only its static facts (nodes, links,
    network) are read, to re-time plans for their placements.
    """

    def __init__(
        self,
        clock: Clock,
        perf: PerfModel,
        topology: ClusterState,
        *,
        launch_delay_s: float = DEFAULT_LAUNCH_DELAY_S,
        restart_delay_s: float = DEFAULT_RESTART_DELAY_S,
        progress_every_s: float | None = None,
        keep_step_times: bool = True,
        step_factor: Callable[[str, str], float] | None = None,
        memory_factor: Callable[[str], float] | None = None,
    ) -> None:
        self.clock = clock
        self._keep_step_times = keep_step_times
        self.perf = perf
        self._topology = topology
        self.launch_delay_s = launch_delay_s
        self.restart_delay_s = restart_delay_s
        self._sink: EventSink | None = None
        self._runs: dict[str, _Run] = {}
        self._gen = itertools.count()
        self._seq = itertools.count()
        self._heap: list[tuple[float, int, int, BackendEvent]] = []  # (time, seq, gen, event)
        self.step_time_by_job: dict[str, list[float]] = {}
        """Every placed step time a job ran at (for metrics and tests); with
        ``keep_step_times=False`` (a long-lived service) a job's entry goes when it ends."""
        self.progress_every_s = progress_every_s
        self._last_progress = -float("inf")
        self._lost: list[BackendEvent] = []
        self.step_factor = step_factor
        self.memory_factor = memory_factor
        self.over_memory: set[str] = set()
        """Jobs that ran at least once with a true peak above their GPU's memory."""

    # -- Backend protocol ------------------------------------------------------------------
    def connect(self, sink: EventSink) -> None:
        self._sink = sink

    def start(self, job: JobView, allocation: Allocation) -> None:
        now = self.clock.now()
        if job.id in self._runs:
            raise RuntimeError(f"job {job.id} is already running in the simulator")
        delay = self.launch_delay_s + (self.restart_delay_s if job.steps_done > 0 else 0.0)
        self._launch(job, allocation, now, delay)

    def stop(self, job_id: str, reason: str) -> float:
        run = self._runs.pop(job_id)
        steps = run.steps_at(self.clock.now())
        log.debug("stop %s at %.1f steps (%s)", job_id, steps, reason)
        return steps

    def resize(self, job: JobView, allocation: Allocation) -> float:
        now = self.clock.now()
        run = self._runs.pop(job.id)
        steps = run.steps_at(now)
        resumed = replace(job, steps_done=steps)
        self._launch(resumed, allocation, now, self.launch_delay_s + self.restart_delay_s)
        return steps

    def cancel(self, job_id: str) -> None:
        self._runs.pop(job_id, None)

    def forget(self, job_id: str) -> None:
        """The job ended and left the Controller: drop what is kept about it."""
        self._runs.pop(job_id, None)
        if not self._keep_step_times:
            self.step_time_by_job.pop(job_id, None)

    def steps_done(self, job_id: str) -> float:
        run = self._runs.get(job_id)
        return run.steps_at(self.clock.now()) if run else 0.0

    # -- driving the simulation ------------------------------------------------------------
    def poll(self, now: float) -> None:
        """Deliver the events due by ``now`` (and progress reports, when asked for)."""
        due = self.pop_due(now)
        if self._lost:
            due, self._lost = [*self._lost, *due], []
        self.deliver(due)
        if self.progress_every_s is not None and now - self._last_progress >= \
                self.progress_every_s:
            self._last_progress = now
            self.deliver([Progress(job_id, now, run.steps_at(now))
                          for job_id, run in self._runs.items() if run.run_start <= now])

    def inventory(self) -> ClusterState:
        """The nodes (the same object until one joins or leaves)."""
        return self._topology

    def add_node(self, node: Node) -> None:
        """A machine joins (all its GPUs free)."""
        self._topology = self._topology.with_node(node)

    def remove_node(self, node_id: str, reason: str = "") -> None:
        """A machine leaves: every job running on it is lost, resumable from the steps it
        had made (the simulator checkpoints continuously)."""
        now = self.clock.now()
        why = reason or f"node {node_id} left the cluster"
        for job_id, run in list(self._runs.items()):
            if any(n == node_id for n, _ in run.allocation.placement):
                del self._runs[job_id]
                self._lost.append(Preempted(job_id, now, run.steps_at(now), why))
        self._topology = self._topology.without_node(node_id)

    def next_event_time(self) -> float | None:
        """Time of the earliest live event, or None when nothing is scheduled."""
        if self._lost:
            return self.clock.now()
        while self._heap:
            t, _, gen, ev = self._heap[0]
            run = self._runs.get(ev.job_id)
            if run is not None and run.gen == gen:
                return t
            heapq.heappop(self._heap)  # superseded launch
        return None

    def pop_due(self, until: float) -> list[BackendEvent]:
        """Remove and return the live events due at or before ``until``, in time order."""
        out: list[BackendEvent] = []
        while self._heap and self._heap[0][0] <= until:
            _, _, gen, ev = heapq.heappop(self._heap)
            run = self._runs.get(ev.job_id)
            if run is None or run.gen != gen:
                continue
            if isinstance(ev, Finished | OutOfMemory):
                del self._runs[ev.job_id]
            out.append(ev)
        return out

    def deliver(self, events: list[BackendEvent]) -> None:
        if self._sink is None:
            raise RuntimeError("SimBackend not connected to a controller")
        for ev in events:
            self._sink(ev)

    # -- internals -------------------------------------------------------------------------
    def _launch(self, job: JobView, allocation: Allocation, now: float, delay: float) -> None:
        placed = self.perf.placed_plan(job, allocation.plan, allocation.placement,
                                       self._topology)
        if not placed.step_time_s > 0:
            raise ValueError(f"job {job.id}: non-positive step time for {placed.label()}")
        step_s = placed.step_time_s
        if self.step_factor is not None:
            step_s *= self.step_factor(job.id, placed.gpu_type)
        oom = self._out_of_memory(job, allocation, placed, now + delay)
        run = _Run(job=job, allocation=allocation, placed=placed, gen=next(self._gen),
                   launched_at=now, steps_from=job.steps_done, run_start=now + delay,
                   step_time=step_s)
        self._runs[job.id] = run
        self.step_time_by_job.setdefault(job.id, []).append(step_s)
        if oom is not None:  # the first step fails: nothing else of this launch happens
            self._push(run.run_start, run.gen, oom)
            return
        self._push(run.run_start, run.gen, Started(job.id, run.run_start))
        self._push(run.finish_time, run.gen, Finished(job.id, run.finish_time))

    def _out_of_memory(self, job: JobView, allocation: Allocation, placed: Plan,
                       at: float) -> OutOfMemory | None:
        """The failure of a launch whose true peak (the model's own prediction × the job's
        ``memory_factor``; a correction already in the plan is the controller's, not the
        truth's) exceeds the memory of its smallest GPU, as a real rank would report it: the
        model's tensors it held (the true ones) against what the GPU leaves for them."""
        if self.memory_factor is None:
            return None
        factor = self.memory_factor(job.id)
        nodes = self._topology.by_id
        capacity = min((nodes[n].gpu_memory if n in nodes else get_gpu(placed.gpu_type)
                        .memory_bytes) for n, _ in allocation.placement)
        mem = placed.memory
        outside = mem.device - placed.model_tensors_bytes - mem.slack
        raw = outside + (placed.model_tensors_bytes + mem.slack) / placed.memory_factor
        if raw * factor <= capacity:
            return None
        self.over_memory.add(job.id)
        held = round(placed.model_tensors_bytes / placed.memory_factor * factor)
        cap = max(1, placed.tensor_room(capacity))
        return OutOfMemory(job.id, at, job.steps_done, held, cap,
                           f"out of memory on {placed.gpu_type}: the true peak is "
                           f"{factor:.2f}x the predicted")

    def _push(self, t: float, gen: int, ev: BackendEvent) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), gen, ev))
