"""ElasticFlow (Gu et al., ASPLOS'23) as published, the baseline for ``elastic``.

* **Admission control** with minimum satisfactory shares: admitted jobs reserve, in deadline
  order, the fewest GPUs that finish them by their deadline; a job that cannot be satisfied
  is dropped (``mode='reject'``, ElasticFlow's behaviour) or kept as best-effort.
* **Resource allocation**: the leftover GPUs go greedily to the job with the highest marginal
  return (throughput gain per added GPU), with diminishing returns; jobs without deadlines
  share the rest. Re-allocated on every arrival and completion; ElasticFlow treats scaling as
  cheap, so a grow is not required to repay its restart (``Growth(guard=False)``), though the
  restart is still charged in the simulation and in the predictions.
* **Data parallelism only.** ElasticFlow profiles throughput against the number of
  data-parallel workers. As in vTrain's re-implementation, a model that does not fit one GPU
  keeps the smallest tensor/pipeline degree it needs (the predictor's smallest plan on the
  type) and scales only ``dp``, in powers of two (buddy sizes). Step times of the dp-scaled
  plans come from the same performance model, on the packed placement.
* **One GPU type per job.** ElasticFlow assumes a homogeneous cluster; here each GPU type is a
  separate pool and a job is pinned to the pool it is admitted to (or first started on), never
  moved between types.
* **Buddy placement**: power-of-two sizes, a job of at most a node's size on one node (the
  tightest that fits), larger ones on whole free nodes; when neither exists the GPUs are taken
  best-fit across nodes (standing in for ElasticFlow's defragmenting migration).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from predictor.plan import Plan
from scheduler.cluster import ClusterState, Placement
from scheduler.job import JobView
from scheduler.perf import AnalyticalPerfModel
from scheduler.placement import FreeGpus
from scheduler.policies.deadline import (
    LAUNCH_DELAY_S,
    RESTART_DELAY_S,
    Admission,
    BookingRule,
    DeadlineConfig,
    DeadlineEngine,
    EnginePolicy,
    Growth,
    Option,
    PlanSpace,
    Prediction,
    pareto,
)
from scheduler.policies.deadline.strategies import catalog_value
from scheduler.policy import PerfModel, register


def _pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def dp_only_options(job: JobView, state: ClusterState,
                    perf: PerfModel) -> dict[str, tuple[Option, ...]]:
    """Per GPU type: the smallest plan (minimum tp·pp that fits) scaled by data parallelism in
    powers of two, each re-timed by ``perf`` on the packed placement. Jobs without a model
    (hand-made plans) use their own plans with that tp·pp and a power-of-two dp."""
    free = FreeGpus.from_state(state)
    out: dict[str, tuple[Option, ...]] = {}
    by_type: dict[str, list[Plan]] = {}
    for p in job.plans:
        by_type.setdefault(p.gpu_type, []).append(p)
    gb = job.train.global_batch if job.train is not None else None
    for t, plans in by_type.items():
        base = min(plans, key=lambda p: (p.num_gpus, p.step_time_s))
        mp = base.parallel.tp * base.parallel.pp
        opts: list[Option] = []
        if job.model is None or job.train is None or gb is None:
            for p in plans:
                if p.parallel.tp * p.parallel.pp == mp and _pow2(p.parallel.dp):
                    opts.append(Option(t, p.num_gpus, p))
        else:
            cap = free.capacity(t)
            dp = base.parallel.dp
            while mp * dp <= cap:
                if gb % dp == 0 and _pow2(dp):
                    mb = min(base.parallel.micro_batch, gb // dp)
                    while (gb // dp) % mb:
                        mb -= 1
                    par = replace(base.parallel, dp=dp, micro_batch=mb)
                    cand = replace(base, parallel=par)
                    packed = free.packed(t, mp * dp)
                    if packed is not None:
                        cand = perf.placed_plan(job, cand, packed, state)
                        opts.append(Option(t, mp * dp, cand))
                dp *= 2
        if opts:
            out[t] = pareto(opts)
    return out


def buddy_place(free: FreeGpus, o: Option) -> Placement | None:
    """Buddy placement (see the module docstring); does not take the GPUs."""
    t, n = o.gpu_type, o.num_gpus
    size = free.node_size(t)
    ids = free.node_ids(t)
    if n <= size:
        fits = [(free.free_on(i), k, i) for k, i in enumerate(ids) if free.free_on(i) >= n]
        if fits:
            return ((min(fits)[2], n),)
    elif n % size == 0:
        whole = [i for i in ids if free.free_on(i) == size]
        if len(whole) >= n // size:
            return tuple((i, size) for i in whole[: n // size])
    return free.best_fit(t, n, o.plan.required_bytes, o.plan.parallel.tp)


def elasticflow_config(
    *,
    mode: str = "reject",
    slack: float = 0.05,
    resize_guard: bool = False,
    launch_delay_s: float = LAUNCH_DELAY_S,
    restart_delay_s: float = RESTART_DELAY_S,
    type_value: Callable[[str], float] | None = None,
) -> DeadlineConfig:
    """ElasticFlow as a composition of the deadline strategies (the arguments are
    ``ElasticFlowPolicy``'s): data-parallel options in powers of two, buddy placement, one GPU
    type per job; shares booked as early as possible; admission only into what the bookings
    leave, no opportunity cost; grows without a restart guard."""
    return DeadlineConfig(
        plans=PlanSpace(dp_only_options, buddy_place, pin_type=True),
        prediction=Prediction(slack, launch_delay_s, restart_delay_s),
        booking=BookingRule(type_value=type_value or catalog_value),
        admission=Admission(infeasible=mode),
        growth=Growth(guard=resize_guard),
    )


@register("elasticflow")
class ElasticFlowPolicy(EnginePolicy):
    """ElasticFlow's algorithm (see the module docstring). ``mode`` and ``slack`` as for
    ``elastic``; ``resize_guard``: require a grow to repay its restart (not ElasticFlow's);
    ``launch_delay_s``, ``restart_delay_s``, ``type_value`` as for ``elastic``; ``seed``
    accepted for a uniform interface. The strategies these compose are in
    ``elasticflow_config``."""

    name = "elasticflow"

    def __init__(
        self,
        perf: PerfModel | None = None,
        *,
        mode: str = "reject",
        slack: float = 0.05,
        resize_guard: bool = False,
        launch_delay_s: float = LAUNCH_DELAY_S,
        restart_delay_s: float = RESTART_DELAY_S,
        type_value: Callable[[str], float] | None = None,
        seed: int = 0,
    ) -> None:
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.seed = seed
        self.engine = DeadlineEngine(self.name, self.perf, elasticflow_config(
            mode=mode, slack=slack, resize_guard=resize_guard, launch_delay_s=launch_delay_s,
            restart_delay_s=restart_delay_s, type_value=type_value))
