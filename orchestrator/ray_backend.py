"""``RayBackend``: runs the controller's allocations on a Ray cluster.

Inventory. Every GPU node of the cluster declares its GPU type and a stable name as Ray node
labels, and its GPU count as Ray's ``GPU`` resource::

    ray start --address=<head>:6379 --num-gpus=4 \\
        --labels="frenzy.io/gpu-type=A800-80G,frenzy.io/node-id=a800"

(optional: ``frenzy.io/interconnect=nvlink|pcie``; the GPU catalog's default otherwise).
``inventory`` turns the live nodes into a ``ClusterState``; a GPU node without the
``frenzy.io/gpu-type`` label is ignored (with a warning), one without ``frenzy.io/node-id``
is named by its Ray node id. Nodes joining or leaving show up in the next ``inventory``
(the control loop reads it every turn). A node Ray reports dead takes its jobs with it: each
run placed on it is torn down and reported ``Preempted`` from its last checkpoint, with the
node named as the reason — whether the loss is first seen in the inventory or as the death
of a worker actor on that node.

Allocation → placement group. An allocation ``[(node, n), ...]`` becomes one placement group
of one ``{"GPU": 1}`` bundle per GPU, each bundle pinned to its node by a
``bundle_label_selector`` on ``frenzy.io/node-id`` (strategy PACK), and one
``TrainingWorker`` actor per bundle (rank i ↔ bundle i, in placement order, so tp groups fill
a node first). Removing the group releases the GPUs; every end of a run — finished, failed,
stopped, cancelled, preempted — kills the actors and removes the group *before* the event is
reported, so the controller never re-grants GPUs that Ray still holds.

Warm pool (``RayBackendConfig.warm_pool``, on in ``frenzy serve``). The built-in trainer's
ranks then run on long-lived workers, one per GPU slot of every node, started with the
backend and reused across launches (``orchestrator.warm_pool``): the launch still creates its
placement group (Ray's GPU accounting and the node pinning are unchanged) and waits for it,
but hands its ranks to the slots' warm workers instead of starting processes. A worker is
reused only after its rank returned cleanly; every other end kills it, as without the pool,
and the pool starts a replacement. Entrypoint launches keep actors of their own (their
``runtime_env`` is per job, and the user's process is started fresh anyway), with their GPU
chosen by slot like the pooled ones.

Events. Commands return at once (``stop``/``resize`` wait for the checkpoint); what follows
is discovered by ``poll``, which the control loop calls on its thread: placement
group ready → rendezvous → ``run`` on every rank; rank 0's status → ``Started`` (first step
made) and ``Progress``; the ranks' results → ``Finished`` or ``Failed``; a dead actor or node →
``Preempted`` from the last checkpoint, or ``Failed`` once the job has been restarted
``max_restarts`` times.

Working directory. An entrypoint job's ``extra["working_dir"]`` (a folder on the service's
machine) is packaged with Ray's ``runtime_env`` machinery (``ship_working_dir``) and set as
each worker actor's ``runtime_env`` ``working_dir``: Ray downloads and unpacks it on every
node and starts the actor in it. The entrypoint does not run there: Ray's unpacked folder is
a cache shared by every actor whose package has the same content, so the sandbox copies it
into the rank's own private folder and starts the command in that copy
(``orchestrator.sandbox.JobBox.install_workdir``).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shlex
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import ray
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from orchestrator.backend import (
    BackendEvent,
    Clock,
    EventSink,
    Failed,
    Finished,
    OutOfMemory,
    Preempted,
    Progress,
    Started,
    WallClock,
)
from orchestrator.sandbox import check_shippable
from orchestrator.trainer.checkpoint import latest_step
from orchestrator.trainer.loop import RunConfig, RunResult, apply_options, numbered_losses
from orchestrator.trainer.memory import RankOutOfMemory
from orchestrator.trainer.model import check_supported
from orchestrator.trainer.worker import TrainingWorker
from orchestrator.warm_pool import Slot, WarmPool, pool_nodes
from predictor.gpus import load_gpu_catalog
from predictor.runtimes import FRENZY
from scheduler.cluster import Allocation, ClusterState, Node
from scheduler.job import JobView

log = logging.getLogger(__name__)

KEPT_TIMINGS = 4096
"""Placement-group timings kept (``pg_ready_s``, ``workers_up_s``, ``pg_remove_s``)."""
KEPT_ENDED_JOBS = 256
"""Ended jobs whose placements and losses stay readable."""
GPU_TYPE_LABEL = "frenzy.io/gpu-type"
NODE_ID_LABEL = "frenzy.io/node-id"
INTERCONNECT_LABEL = "frenzy.io/interconnect"
GPU_MEMORY_LABEL = "frenzy.io/gpu-memory-bytes"
"""Optional: the node's memory per GPU when it is not the catalog's figure (a smaller MIG
slice, or an emulated GPU of tiny capacity whose CPU trainer enforces it as its cap)."""
RAY_NODE_ID_LABEL = "ray.io/node-id"
PG_PREFIX = "frenzy-"

UNREACHABLE_GRACE_S = 60.0
"""How long a worker whose connection broke (``ActorUnavailableError``) may stay unreachable
before its job is requeued anyway; Ray declares a killed node dead well before (≈ 13 s), and
that verdict requeues the job at once, naming the node."""

ERROR_GRACE_S = 5.0
"""After one rank fails, how long to wait for the others before judging the cause (a killed
peer makes the survivors' collectives fail too; the dead actor's own error decides)."""

LAST_STATUS_S = 2.0
"""How long a failed launch's final read of rank 0's progress may take (its actor outlives
the failed task)."""


@dataclass(frozen=True)
class RayBackendConfig:
    """Knobs of the Ray backend. ``checkpoint_dir`` must be visible to every node."""

    checkpoint_dir: str
    checkpoint_every: int = 50
    max_restarts: int = 3
    launch_timeout_s: float = 120.0
    stop_timeout_s: float = 60.0
    lr: float = 3e-3
    seed: int = 0
    torch_threads: int = 1
    inter_node_bw_gbs: float = 12.5
    warm_pool: bool = False
    """Keep a warm ``TrainingWorker`` per GPU of every node and run the built-in trainer's
    launches on them (``orchestrator.warm_pool``); entrypoint launches keep fresh actors."""


@dataclass
class _Run:
    """One launch of one job on one placement group."""

    job: JobView
    allocation: Allocation
    cfg: RunConfig
    pg: PlacementGroup
    workers: list[Any]
    launched_at: float
    phase: str = "launching"  # launching → running
    addr_ref: Any = None
    pg_ready_ref: Any = None
    where_refs: list[Any] = field(default_factory=list)
    run_refs: list[Any] = field(default_factory=list)
    status_ref: Any = None
    where: list[dict[str, Any]] | None = None
    started: bool = False
    steps_done: float = 0.0
    reported_steps: float = 0.0
    checkpoint_step: int = 0
    loss: float | None = None
    samples_per_s: float | None = None
    peak_tensors_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    error_since: float | None = None
    unreachable_since: float | None = None
    losses: list[float] = field(default_factory=list)
    slots: list[Slot] | None = None
    """The warm pool's GPU slots of this launch, rank order (pooled backend only)."""
    pooled: bool = False
    """The ranks run on the pool's warm workers (else on actors of the launch's own)."""
    pg_wait_ref: Any = None
    """Pooled workers wait for nothing: the run starts once the group holds the GPUs."""
    relaunched: bool = False
    """This launch replaces one whose warm worker was found dead when given the job."""


def read_inventory(inter_node_bw_gbs: float = 12.5) -> tuple[ClusterState, dict[str, dict]]:
    """The live GPU nodes of the connected Ray cluster as a ``ClusterState`` (all GPUs free),
    and for each node the label selector that pins a bundle to it."""
    catalog = load_gpu_catalog()
    nodes: list[Node] = []
    selectors: dict[str, dict[str, str]] = {}
    for raw in ray.nodes():
        if not raw.get("Alive"):
            continue
        gpus = int(raw.get("Resources", {}).get("GPU", 0))
        labels = raw.get("Labels") or {}
        if gpus <= 0:
            continue
        gpu_type = labels.get(GPU_TYPE_LABEL)
        if gpu_type is None or gpu_type not in catalog:
            log.warning("Ray node %s has %d GPUs but %s; ignored", raw.get("NodeID"), gpus,
                        f"no {GPU_TYPE_LABEL} label" if gpu_type is None
                        else f"unknown GPU type {gpu_type!r}")
            continue
        name = labels.get(NODE_ID_LABEL) or str(raw["NodeID"])[:12]
        selectors[name] = ({NODE_ID_LABEL: name} if NODE_ID_LABEL in labels
                           else {RAY_NODE_ID_LABEL: str(raw["NodeID"])})
        gpu = catalog[gpu_type]
        link = labels.get(INTERCONNECT_LABEL, gpu.link)
        memory = gpu.memory_bytes
        if GPU_MEMORY_LABEL in labels:
            try:
                memory = int(labels[GPU_MEMORY_LABEL])
            except ValueError:
                log.warning("Ray node %s: %s=%r is not a byte count; the catalog's %d used",
                            name, GPU_MEMORY_LABEL, labels[GPU_MEMORY_LABEL], memory)
        nodes.append(Node(id=name, gpu_type=gpu_type, gpu_memory=memory,
                          total_gpus=gpus, free_gpus=gpus,
                          interconnect=link if link in ("nvlink", "pcie") else gpu.link))
    nodes.sort(key=lambda n: n.id)
    return ClusterState(nodes=tuple(nodes), inter_node_bw_gbs=inter_node_bw_gbs), selectors


def ship_working_dir(path: str) -> str:
    """Upload the folder ``path`` to the Ray cluster; the URI an actor's ``runtime_env``
    ``working_dir`` takes.

    Ray accepts a local folder as ``working_dir`` only in ``ray.init`` (the whole driver);
    for one actor it needs a package URI. This is the packaging ``ray.init`` and the Job SDK
    use (``upload_working_dir_if_needed``): the folder is zipped (``.gitignore``/``.rayignore``
    and Ray's default excludes honoured) into a content-addressed ``gcs://_ray_pkg_<hash>.zip``,
    uploaded once per content, within Ray's package size limit; each node downloads and
    unpacks it once, and the actor starts in the unpacked folder. Only a folder all of whose
    files every local user may read is shipped (``sandbox.check_shippable``)."""
    from ray._private.runtime_env.working_dir import upload_working_dir_if_needed

    if not os.path.isdir(path):
        raise ValueError(f"{path} is not a folder on the service's machine")
    check_shippable(path)  # again at launch: the folder may have changed since submission
    with tempfile.TemporaryDirectory(prefix="frenzy-pkg-") as scratch:
        env = upload_working_dir_if_needed({"working_dir": path}, include_gitignore=True,
                                           scratch_dir=scratch, logger=log)
    return str(env["working_dir"])


def _dead_nodes(allocation: Allocation) -> list[str]:
    """The nodes of ``allocation`` that Ray no longer reports alive."""
    alive = set()
    for raw in ray.nodes():
        if raw.get("Alive"):
            labels = raw.get("Labels") or {}
            alive.add(labels.get(NODE_ID_LABEL) or str(raw["NodeID"])[:12])
    return sorted({n for n, _ in allocation.placement if n not in alive})


def _node_loss(nodes: Sequence[str]) -> str:
    which = ", ".join(nodes)
    return f"node {which} died (Ray reports it dead); the job's workers there are gone"


def _last_line(e: BaseException) -> str:
    lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else type(e).__name__)[:500]


class RayBackend:
    """The ``Backend`` over a connected Ray cluster; see the module docstring."""

    def __init__(self, config: RayBackendConfig, clock: Clock | None = None) -> None:
        if not ray.is_initialized():
            raise RuntimeError("RayBackend needs a connected Ray cluster (ray.init / "
                               "orchestrator.emulated.connect)")
        self.config = config
        self.clock = clock or WallClock()
        self._sink: EventSink | None = None
        self._runs: dict[str, _Run] = {}
        self._events: list[BackendEvent] = []
        self._gen = itertools.count()
        self._incarnation = uuid.uuid4().hex[:8]
        """In every placement group's name: a restarted service on a long-lived Ray cluster
        must not collide with the names of its predecessor's groups (Ray removes those when
        it notices the old driver is gone, which may be after the new one starts)."""
        self._selectors: dict[str, dict[str, str]] = {}
        self._state: ClusterState | None = None
        self._worker_cls = ray.remote(TrainingWorker)
        self.pg_ready_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        """Seconds from creating each placement group to it being ready (as first seen by
        ``poll``, so within one poll interval); the latest ``KEPT_TIMINGS``."""
        self.workers_up_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        """Seconds from creating each placement group to all its worker actors answering."""
        self.pg_remove_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        self.rendezvous_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        """Seconds rank 0 spent joining its job's process group (gloo/NCCL init)."""
        self.run_to_first_step_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        """Seconds from rank 0's ``run`` starting to its first step done (rendezvous, model
        build, checkpoint load, the step)."""
        self.launch_to_first_step_s: deque[float] = deque(maxlen=KEPT_TIMINGS)
        """Seconds from ``start`` (placement group created) to the ``Started`` event."""
        self._pool = (WarmPool(self._worker_cls, config.torch_threads)
                      if config.warm_pool else None)
        self._prefer_slots: Sequence[Slot] = ()
        """Slots a relaunch takes first (the ones its first attempt had)."""
        self.placements: dict[str, list[dict[str, Any]]] = {}
        """Per job, what its workers reported from inside the actors at the latest launch
        (live jobs, and the latest ``KEPT_ENDED_JOBS`` ended ones)."""
        self.losses: dict[str, list[float]] = {}
        """Per job, the loss of every step made (all launches; a resumed launch repeats
        none: only steps beyond the last one recorded are appended); kept like
        ``placements``."""
        self._loss_step: dict[str, int] = {}
        self._ended: deque[str] = deque()
        self.inventory()

    def forget(self, job_id: str) -> None:
        """The job ended and left the Controller: its placements and losses stay readable
        until ``KEPT_ENDED_JOBS`` later jobs have ended."""
        self._loss_step.pop(job_id, None)
        self._ended.append(job_id)
        while len(self._ended) > KEPT_ENDED_JOBS:
            old = self._ended.popleft()
            if old not in self._runs:  # not resubmitted under the same id meanwhile
                self.placements.pop(old, None)
                self.losses.pop(old, None)

    # -- inventory -------------------------------------------------------------------------
    def inventory(self) -> ClusterState:
        """The live GPU nodes (all GPUs free; the controller keeps the accounting); the same
        object as last time when nothing changed. Runs on nodes that are gone are lost."""
        state, selectors = read_inventory(self.config.inter_node_bw_gbs)
        gone = set(self._selectors) - set(selectors)
        changed = set(self._selectors) != set(selectors) or state != self._state
        self._selectors = selectors
        if changed:
            self._sync_pool()
        if gone:
            for run in list(self._runs.values()):
                lost = sorted({n for n, _ in run.allocation.placement if n in gone})
                if lost:
                    self._requeue(run, _node_loss(lost))
        if self._state is not None and state == self._state:
            return self._state
        self._state = state
        return state

    def next_event_time(self) -> float | None:
        """Unknown: Ray's events are found by polling."""
        return None

    # -- Backend protocol ------------------------------------------------------------------
    def connect(self, sink: EventSink) -> None:
        self._sink = sink

    def start(self, job: JobView, allocation: Allocation) -> None:
        if job.id in self._runs:
            raise RuntimeError(f"job {job.id} is already running on Ray")
        try:
            cfg = self._run_config(job, allocation)
        except (ValueError, TypeError) as e:
            self._events.append(Failed(job.id, self.clock.now(), f"cannot run: {e}"))
            return
        missing = [n for n, _ in allocation.placement if n not in self._selectors]
        if missing:
            self.inventory()
            missing = [n for n, _ in allocation.placement if n not in self._selectors]
        if missing:
            self._events.append(Preempted(job.id, self.clock.now(), job.steps_done,
                                          f"node(s) {', '.join(missing)} not in the Ray cluster"))
            return
        bundles: list[dict[str, float]] = []
        selectors: list[dict[str, str]] = []
        for node, n in allocation.placement:
            bundles += [{"GPU": 1.0}] * n
            selectors += [self._selectors[node]] * n
        gen = next(self._gen)
        pg = placement_group(bundles, strategy="PACK", bundle_label_selector=selectors,
                             name=f"{PG_PREFIX}{job.id}-{self._incarnation}-{gen}")
        slots: list[Slot] | None = None
        if self._pool is not None:
            slots = self._take_slots(allocation, self._prefer_slots)
            if slots is None:
                remove_placement_group(pg)
                self._events.append(Preempted(job.id, self.clock.now(), job.steps_done,
                                              "no free GPU slot in the warm pool"))
                return
        extra_opts: dict[str, Any] = {}
        if cfg.working_dir:
            try:
                extra_opts["runtime_env"] = {"working_dir": ship_working_dir(cfg.working_dir)}
            except (RayError, ValueError, OSError, RuntimeError) as e:
                remove_placement_group(pg)
                if self._pool is not None and slots is not None:
                    self._pool.give_back(slots, [True] * len(slots))
                self._events.append(Failed(job.id, self.clock.now(), "cannot ship the "
                                           f"working_dir {cfg.working_dir}: {_last_line(e)}"))
                return
        pooled = slots is not None and not cfg.entrypoint
        if pooled:
            assert slots is not None
            workers = [s.actor for s in slots]
        else:
            workers = [
                self._worker_cls.options(
                    # with the pool, every GPU is chosen by slot (see orchestrator.warm_pool)
                    num_cpus=0, num_gpus=0 if slots is not None else 1, max_concurrency=2,
                    max_restarts=0, name=None,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, i),
                    **extra_opts,
                ).remote(i, self.config.torch_threads,
                         slots[i].index if slots is not None else None)
                for i in range(len(bundles))
            ]
        run = _Run(job=job, allocation=allocation, cfg=cfg, pg=pg, workers=workers,
                   launched_at=time.monotonic(), steps_done=job.steps_done,
                   reported_steps=job.steps_done, slots=slots, pooled=pooled)
        run.pg_ready_ref = pg.ready()
        if pooled:
            self._launch_pooled(run)
        else:
            run.addr_ref = workers[0].address.remote()
            run.where_refs = [w.where.remote() for w in workers]
        self._runs[job.id] = run
        log.info("job %s: launching %s (pg %s)", job.id, allocation.describe(), pg.id.hex())

    def stop(self, job_id: str, reason: str) -> float:
        run = self._runs.get(job_id)
        if run is None:
            return float(latest_step(self.config.checkpoint_dir, job_id))
        steps = run.job.steps_done
        if run.phase == "running":
            for w in run.workers:
                w.request_stop.remote()
            ready, _ = ray.wait(run.run_refs, num_returns=len(run.run_refs),
                                timeout=self.config.stop_timeout_s)
            results = []
            clean = [False] * len(run.run_refs)
            for i, ref in enumerate(run.run_refs):
                if ref not in ready:
                    continue
                try:
                    results.append(ray.get(ref))
                    clean[i] = True
                except RayError as e:
                    log.warning("job %s: a rank failed while stopping: %s", job_id,
                                _last_line(e))
            steps = max([steps, *(r.checkpoint_step for r in results)])
        else:
            clean = []
        if not run.cfg.entrypoint:
            steps = max(steps, latest_step(self.config.checkpoint_dir, job_id))
        self._teardown(run, clean)
        log.info("job %s: stopped at checkpoint step %s (%s)", job_id, steps, reason)
        return float(steps)

    def resize(self, job: JobView, allocation: Allocation) -> float:
        steps = self.stop(job.id, "resize")
        self.start(replace(job, steps_done=steps), allocation)
        return steps

    def cancel(self, job_id: str) -> None:
        run = self._runs.get(job_id)
        if run is not None:
            self._teardown(run)
        self._events = [e for e in self._events if e.job_id != job_id]

    def steps_done(self, job_id: str) -> float:
        run = self._runs.get(job_id)
        return run.steps_done if run else 0.0

    # -- driving ---------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> None:
        """Advance every launch and deliver what happened (call on the controller's thread;
        ``now`` is not needed: Ray's events are what has happened)."""
        for run in list(self._runs.values()):
            try:
                if run.phase == "launching":
                    self._poll_launch(run)
                if run.phase == "running":
                    self._poll_status(run)
                    self._poll_results(run)
            except RayError as e:  # pragma: no cover - defensive: never kill the pump
                log.exception("job %s: unexpected Ray error", run.job.id)
                self._end(run, Failed(run.job.id, self.clock.now(), _last_line(e)))
        if self._pool is not None:
            self._pool.poll()
        events, self._events = self._events, []
        for ev in events:
            self._deliver(ev)

    def running_jobs(self) -> list[str]:
        return sorted(self._runs)

    def kill_worker(self, job_id: str, rank: int) -> None:
        """Kill one worker actor of a running job (fault injection for tests)."""
        ray.kill(self._runs[job_id].workers[rank], no_restart=True)

    def shutdown(self) -> None:
        """Cancel every run (actors killed, placement groups removed), and end the pool."""
        for job_id in list(self._runs):
            self.cancel(job_id)
        if self._pool is not None:
            self._pool.shutdown()

    def wait_warm(self, timeout_s: float = 120.0) -> bool:
        """Wait until the warm pool has a worker up on every GPU (True at once without a
        pool): a service that starts with a burst of jobs may wait for it first."""
        return self._pool is None or self._pool.wait_warm(timeout_s)

    @property
    def pool(self) -> WarmPool | None:
        """The warm pool (None unless ``RayBackendConfig.warm_pool``)."""
        return self._pool

    # -- internals -------------------------------------------------------------------------
    def _run_config(self, job: JobView, allocation: Allocation) -> RunConfig:
        plan = allocation.plan
        par = plan.parallel
        if allocation.num_gpus != par.num_gpus:
            raise ValueError(f"allocation has {allocation.num_gpus} GPUs, plan needs "
                             f"{par.num_gpus}")
        entry = job.extra.get("entrypoint")
        entrypoint: tuple[str, ...] | None = None
        working_dir = job.extra.get("working_dir")
        if entry:
            entrypoint = tuple(shlex.split(entry) if isinstance(entry, str) else map(str, entry))
        elif working_dir:
            raise ValueError("a working_dir is shipped for an entrypoint; this job has none")
        else:  # the built-in trainer: refuse what it would not run as priced (no silent
            # fallback to an unsharded optimizer that needs far more memory than predicted)
            why = FRENZY.unsupported(par.pp, par.zero_stage)
            if why is None and job.train is not None:
                why = FRENZY.unsupported_optimizer(job.train.optimizer.value)
            if why is None and job.model is not None:
                why = FRENZY.unsupported_activation(job.model)
            if why is not None:
                raise ValueError(f"the built-in trainer cannot run this plan: {why}, or give "
                                 "an entrypoint")
        if entrypoint is None and (job.model is None or job.train is None):
            raise ValueError("the built-in trainer needs the job's model and training spec")
        if job.model is not None and job.train is not None:
            job.train.check_against(job.model)
            if entrypoint is None:
                check_supported(job.model, par.tp)
        train = job.train
        cfg = RunConfig(
            job_id=job.id, model=job.model,
            global_batch=train.global_batch if train else par.dp * par.micro_batch,
            seq_len=train.seq_len if train else 0, total_steps=job.total_steps,
            tp=par.tp, dp=par.dp, pp=par.pp, micro_batch=par.micro_batch,
            recompute=par.recompute, zero_stage=par.zero_stage, precision=plan.precision,
            optimizer=train.optimizer if train else RunConfig.optimizer,
            lr=self.config.lr, seed=self.config.seed,
            checkpoint_dir=self.config.checkpoint_dir,
            checkpoint_every=self.config.checkpoint_every, entrypoint=entrypoint,
            working_dir=str(working_dir) if working_dir else None,
            env={"FRENZY_RESUME_STEP": str(int(job.steps_done))},
            memory_cap_bytes=self._tensor_cap(allocation),
        )
        # The job's data, learning-rate schedule, seed, init_from (JSON from the service).
        options = job.extra.get("trainer")
        return apply_options(cfg, options if isinstance(options, dict) else None)

    def _tensor_cap(self, allocation: Allocation) -> int:
        """The tensor bytes a rank of ``allocation`` may hold: its smallest node's GPU memory
        less what the plan predicts outside the model's tensors (allocator slack, CUDA
        context, cuBLAS workspaces: a CPU rank has none of them) — the cap a CPU rank
        enforces in place of the GPU's (``orchestrator.trainer.memory``)."""
        nodes = self._state.by_id if self._state is not None else {}
        sizes = [nodes[n].gpu_memory for n, _ in allocation.placement if n in nodes]
        if not sizes:
            return 0
        return max(1, allocation.plan.tensor_room(min(sizes)))

    def _poll_launch(self, run: _Run) -> None:
        if run.pg_ready_ref is not None and ray.wait([run.pg_ready_ref], timeout=0)[0]:
            run.pg_ready_ref = None
            self.pg_ready_s.append(time.monotonic() - run.launched_at)
        refs = [run.addr_ref, *run.where_refs]
        if run.pg_wait_ref is not None:
            refs.append(run.pg_wait_ref)
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        if len(ready) < len(refs):
            if time.monotonic() - run.launched_at > self.config.launch_timeout_s:
                self._requeue(run, f"workers not placed within "
                                   f"{self.config.launch_timeout_s:.0f} s")
            return
        try:
            addr, port = ray.get(run.addr_ref)
            run.where = ray.get(run.where_refs)
        except RayActorError as e:
            if run.pooled and not run.relaunched and not _dead_nodes(run.allocation):
                self._relaunch(run, _last_line(e))
                return
            self._requeue(run, f"worker died while starting: {_last_line(e)}")
            return
        except RayTaskError as e:  # a warm worker refused the job (still busy)
            self._requeue(run, f"worker could not take the job: {_last_line(e)}")
            return
        self.workers_up_s.append(time.monotonic() - run.launched_at)
        self.placements[run.job.id] = run.where
        cfg = replace(run.cfg, master_addr=addr, master_port=port)
        run.run_refs = [w.run.remote(cfg) for w in run.workers]
        run.status_ref = run.workers[0].status.remote()
        run.phase = "running"

    def _poll_status(self, run: _Run) -> None:
        if run.status_ref is None:
            return
        ready, _ = ray.wait([run.status_ref], timeout=0)
        if not ready:
            return
        try:
            status = ray.get(run.status_ref)
        except RayError:
            run.status_ref = None  # the results poll will see why
            return
        run.status_ref = run.workers[0].status.remote()
        self._absorb(run, status)

    def _absorb(self, run: _Run, status: dict[str, Any]) -> None:
        steps = float(status.get("steps_done", run.steps_done))
        first = float(status.get("first_step", run.job.steps_done))
        run.checkpoint_step = int(status.get("checkpoint_step", run.checkpoint_step))
        if status.get("loss") is not None:
            run.loss = float(status["loss"])
        run.samples_per_s = status.get("samples_per_s")
        for key in ("peak_tensors_bytes", "peak_reserved_bytes"):
            if status.get(key) is not None:
                setattr(run, key, max(int(status[key]), getattr(run, key) or 0))
        if steps > run.steps_done or (steps > first and not run.started):
            new_losses = int(steps - max(run.steps_done, first))
            run.steps_done = steps
            now = self.clock.now()
            if not run.started and steps > first:
                run.started = True
                self._record_start(run, status)
                self._events.append(Started(run.job.id, now))
                log.info("job %s: first step made (launch resumed from step %d)",
                         run.job.id, first)
            history = self.losses.setdefault(run.job.id, [])
            recent = status.get("recent_losses") or ()
            seen = self._loss_step.get(run.job.id, 0)
            for s, loss in recent:
                if s > seen:
                    history.append(float(loss))
                    seen = s
            if not recent and run.loss is not None and new_losses > 0:
                history.append(run.loss)
                seen = int(steps)
            self._loss_step[run.job.id] = seen
            if run.started and steps > run.reported_steps:
                run.reported_steps = steps
                self._events.append(Progress(run.job.id, now, steps, run.loss,
                                             run.samples_per_s, run.peak_tensors_bytes,
                                             run.peak_reserved_bytes))

    def _poll_results(self, run: _Run) -> None:
        ready, pending = ray.wait(run.run_refs, num_returns=len(run.run_refs), timeout=0)
        if not ready:
            return
        results: list[RunResult] = []
        died: str | None = None
        unreachable: str | None = None
        failed: str | None = None
        oom: RankOutOfMemory | None = None
        for ref in ready:
            try:
                results.append(ray.get(ref, timeout=1.0))
            except ActorUnavailableError as e:
                unreachable = unreachable or _last_line(e)
            except RayActorError as e:
                died = died or _last_line(e)
            except RayTaskError as e:
                failed = failed or _last_line(e)
                cause = getattr(e, "cause", None)
                if isinstance(cause, RankOutOfMemory) and (
                        oom is None or cause.held_bytes > oom.held_bytes):
                    oom = cause
            except GetTimeoutError:  # pragma: no cover
                return
        if died is not None or unreachable is not None:
            dead = _dead_nodes(run.allocation)
            if dead:
                self._requeue(run, _node_loss(dead))
            elif died is not None:
                self._requeue(run, f"worker died: {died}")
            else:
                # The connection to a worker broke but its actor is not reported dead: most
                # often its node was killed and Ray has not declared it dead yet. Wait for
                # Ray's verdict (then the reason names the node), up to a grace period.
                now = time.monotonic()
                run.unreachable_since = run.unreachable_since or now
                if now - run.unreachable_since >= UNREACHABLE_GRACE_S:
                    self._requeue(run, f"worker unreachable for {UNREACHABLE_GRACE_S:.0f} s: "
                                       f"{unreachable}")
            return
        if failed is not None:
            now = time.monotonic()
            if pending and (run.error_since is None or now - run.error_since < ERROR_GRACE_S):
                run.error_since = run.error_since or now
                return  # give a dead peer's own error the chance to arrive
            self._absorb_last_status(run)
            if oom is not None:
                self._out_of_memory(run, oom)
                return
            self._end(run, Failed(run.job.id, self.clock.now(), f"training failed: {failed}"))
            return
        if pending:
            return
        final = max(results, key=lambda r: r.steps_done)
        self._absorb(run, {"steps_done": final.steps_done, "first_step": final.first_step,
                           "checkpoint_step": final.checkpoint_step,
                           "loss": final.losses[-1] if final.losses else run.loss,
                           # the last status poll may predate the last steps: the result
                           # carries every loss of this launch, so none is missed
                           "recent_losses": numbered_losses(final.losses,
                                                            final.steps_done)})
        if final.finished:
            if not run.started:
                run.started = True
                self._record_start(run, {})
                self._events.append(Started(run.job.id, self.clock.now()))
            self._end(run, Finished(run.job.id, self.clock.now()), [True] * len(results))
        else:  # stopped without a stop() call: treat as preemption from its checkpoint
            self._requeue(run, "workers stopped early")

    # -- warm pool -------------------------------------------------------------------------
    def _sync_pool(self) -> None:
        """The pool follows the inventory's nodes."""
        if self._pool is not None:
            nodes = pool_nodes()
            self._pool.sync({n: p for n, p in nodes.items() if n in self._selectors})

    def _take_slots(self, allocation: Allocation,
                    prefer: Sequence[Slot] = ()) -> list[Slot] | None:
        """A distinct GPU slot per rank, in placement order (``prefer``'s first); None
        (nothing taken) if a node has fewer free slots than the allocation asks of it."""
        assert self._pool is not None
        taken: list[Slot] = []
        for node, n in allocation.placement:
            got = self._pool.take(node, n, prefer)
            if got is None:
                log.error("warm pool: %s has fewer than %d free GPU slots", node, n)
                self._pool.give_back(taken, [True] * len(taken))
                return None
            taken += got
        return taken

    def _launch_pooled(self, run: _Run) -> None:
        """Hand the launch to its slots' warm workers: each becomes its rank (reset to a
        clean state); the run starts once the placement group holds the GPUs."""
        assert self._pool is not None and run.slots is not None
        self._pool.use(run.slots)
        run.where_refs = [w.assign.remote(i) for i, w in enumerate(run.workers)]
        run.addr_ref = run.workers[0].address.remote()
        run.pg_wait_ref = run.pg_ready_ref

    def _relaunch(self, run: _Run, why: str) -> None:
        """A warm worker died while idle (found when handed the job, its node alive): start
        the launch again, once, on the node's other slots or the dead one's replacement,
        without counting a restart against the job; the workers that answered stay warm."""
        answered = []
        for ref in run.where_refs:
            try:
                ray.get(ref, timeout=0)
                answered.append(True)
            except RayError:
                answered.append(False)
        log.warning("job %s: a warm worker was dead (%s); launching again", run.job.id, why)
        self._teardown(run, answered)
        self._prefer_slots = run.slots or ()
        try:  # the same slots: the dead worker's replacement and the ones known alive
            self.start(run.job, run.allocation)
        finally:
            self._prefer_slots = ()
        again = self._runs.get(run.job.id)
        if again is not None:
            again.relaunched = True

    def _record_start(self, run: _Run, status: dict[str, Any]) -> None:
        self.launch_to_first_step_s.append(time.monotonic() - run.launched_at)
        if status.get("rendezvous_s") is not None:
            self.rendezvous_s.append(float(status["rendezvous_s"]))
        if status.get("setup_s") is not None:
            self.run_to_first_step_s.append(float(status["setup_s"]))

    def _resume_step(self, run: _Run) -> float:
        """Where the job resumes after losing its workers: its last checkpoint."""
        if run.cfg.entrypoint:
            return float(max(run.job.steps_done, run.checkpoint_step))
        return float(max(run.job.steps_done, latest_step(self.config.checkpoint_dir, run.job.id)))

    def _absorb_last_status(self, run: _Run) -> None:
        """Read rank 0's progress once more before a failed launch ends, so that a step made
        between the last status poll and the failure (its loss, its checkpoint) is kept."""
        try:
            status = ray.get(run.workers[0].status.remote(), timeout=LAST_STATUS_S)
        except (RayError, GetTimeoutError):
            return
        self._absorb(run, status)

    def _out_of_memory(self, run: _Run, oom: RankOutOfMemory) -> None:
        """A rank ran out of memory: the controller re-plans the job with what was measured."""
        held = max(oom.held_bytes, run.peak_tensors_bytes or 0)
        where = "CUDA" if oom.cuda else "emulated GPU"
        reason = (f"out of memory on {run.allocation.plan.gpu_type} ({where}): a rank held "
                  f"{held:,} bytes of tensors, its cap was {oom.cap_bytes:,}")
        log.warning("job %s: %s", run.job.id, reason)
        self._end(run, OutOfMemory(run.job.id, self.clock.now(), self._resume_step(run), held,
                                   oom.cap_bytes, reason, oom.cuda))

    def _requeue(self, run: _Run, reason: str) -> None:
        """Lost the workers: back to the queue from the last checkpoint, or give up."""
        steps = self._resume_step(run)
        if run.job.restarts >= self.config.max_restarts:
            ev: BackendEvent = Failed(run.job.id, self.clock.now(),
                                      f"{reason}; gave up after {run.job.restarts} restarts")
        else:
            ev = Preempted(run.job.id, self.clock.now(), float(steps), reason)
        log.warning("job %s: %s -> %s", run.job.id, reason, type(ev).__name__)
        self._end(run, ev)

    def _end(self, run: _Run, event: BackendEvent, clean: Sequence[bool] = ()) -> None:
        self._teardown(run, clean)
        self._events.append(event)

    def _teardown(self, run: _Run, clean: Sequence[bool] = ()) -> None:
        """Free the launch's GPUs: workers killed (a pooled worker whose rank returned
        cleanly, per ``clean``, goes back to the pool instead), placement group removed."""
        if run.slots is not None and self._pool is not None:
            if run.pooled:
                keep = [i < len(clean) and clean[i] for i in range(len(run.slots))]
            else:  # the launch's own actors ran it; the slots' warm workers were not touched
                keep = [True] * len(run.slots)
            self._pool.give_back(run.slots, keep)
        if not run.pooled:
            for w in run.workers:
                with contextlib.suppress(RayError, ValueError):  # already gone
                    ray.kill(w, no_restart=True)
        t0 = time.monotonic()
        try:
            remove_placement_group(run.pg)
        except Exception as e:  # never let a removal error leak the rest
            log.warning("job %s: removing placement group: %s", run.job.id, e)
        self.pg_remove_s.append(time.monotonic() - t0)
        self._runs.pop(run.job.id, None)

    def _deliver(self, event: BackendEvent) -> None:
        if self._sink is None:
            raise RuntimeError("RayBackend is not connected to a controller")
        self._sink(event)


def live_placement_groups() -> list[dict[str, Any]]:
    """Frenzy's placement groups that are not removed (leak check)."""
    return [pg for pg in placement_group_table().values()
            if str(pg.get("name", "")).startswith(PG_PREFIX) and pg.get("state") != "REMOVED"]


def gpus_in_use() -> float:
    """GPUs of the Ray cluster currently held by anything (leak check when idle)."""
    total = ray.cluster_resources().get("GPU", 0.0)
    free = ray.available_resources().get("GPU", 0.0)
    return total - free


def wait_released(timeout_s: float = 10.0) -> bool:
    """Wait until no GPU is held and no Frenzy placement group is live."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gpus_in_use() == 0 and not live_placement_groups():
            return True
        time.sleep(0.1)
    return False


__all__: Sequence[str] = ["GPU_TYPE_LABEL", "INTERCONNECT_LABEL", "NODE_ID_LABEL",
                          "RayBackend", "RayBackendConfig", "gpus_in_use",
                          "live_placement_groups", "read_inventory", "wait_released"]
