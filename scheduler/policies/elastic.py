"""Elastic, deadline-aware reallocation (ours): ElasticFlow's admission control and
diminishing-returns allocation over the predictor's full plan space on a heterogeneous cluster.

What it adds to ElasticFlow (``scheduler.policies.elasticflow``), as vTrain's case study
suggests (knowing the best plan at every allocation, not only data parallelism):

* **Every plan.** A job's options at each (GPU type, count) are the predictor's fastest plan
  there — any tp/pp/dp — so the minimum satisfactory share is smaller and each added GPU buys
  more (``deadline.best_plan_options``).
* **Any GPU type, any count.** The minimum share is chosen across GPU types by value-weighted
  GPU-seconds, and a job may be moved to another type when that is what meets its deadline.
* **Resizes must pay for themselves.** A running job is grown only when the predicted time
  saved, net of the checkpoint-restart, exceeds the restart cost again (``resize_gain_factor``)
  and every change of plan is charged the restart in the prediction it is judged by.
* **Running jobs book the fewest GPUs** of a type that still meet their deadline from now,
  not the size with the fewest GPU-seconds (near-linear scaling makes every size cost about
  the same): a job keeps what it holds while nobody needs it, and an arrival can take the
  rest (a shrink, charged the restart, that still meets the deadline).
* **Admission weighs the opportunity cost** of a booking (``opportunity_cost``, default 1.25):
  the deadline ratio counts jobs, so an arrival whose every share would turn away more than
  ``opportunity_cost`` expected deadline arrivals (observed arrival rate × the share of
  recent arrivals that the GPUs it leaves could no longer serve, over the booking, but no
  more than the booking's GPU-seconds could have served of them: ``capacity_bound``) is
  kept best-effort on leftovers instead of reserved, and every share is chosen to turn away
  the fewest. So it departs from ElasticFlow's admission only where its own prediction says
  that giving up this job keeps more than ``opportunity_cost`` others; under overload the
  bound is what keeps that prediction from counting arrivals that would be turned away
  whatever is booked, and the prediction is checked against the policy's own bookings
  (``refusal_guard``): it is scaled by how many of the arrivals predicted to use the room
  of earlier refusals were then admitted into it, so when that room goes unused the
  policy admits as ElasticFlow does. The estimate treats bookings as fixed; with the deadline-order
  re-plan below an arrival due sooner can still get in by pausing the booked job, so it
  overstates the cost a little, and the threshold is 1.25 rather than one job for one job
  (chosen on the tuning split: docs/deadlines.md). ``None`` turns it off (ElasticFlow's
  admission).
* **Bookings in deadline order** (``replan``): an arrival that does not fit beside what is
  promised re-plans every booking earliest deadline first, pausing a running job with slack
  (its booking still finishes it in time, the restart charged) so that a job due sooner
  fits; ElasticFlow only admits into what the bookings leave.
* **The safety margin guards guarantees, not the chance to run.** An arrival refused only by
  the margin (an option of it is on time by the prediction, none with the margin held back)
  is kept best-effort instead of rejected (``within_margin``): a rejection is a certain
  miss. It starts on leftovers only on an option that is on time, and is rejected once,
  still waiting, none is.
* **Running jobs stay on their GPU type** when a share there meets their deadline, and the
  leftovers may move a running job onto faster GPUs of another type when the time saved pays
  for the restart, so that a minimum share on a cheap type does not keep a long job on slow
  GPUs.
* **Wide starts when nobody waits** (``widen_gain``, default 0): once the leftovers are handed out,
  if no job waits (none queued, refused or waiting for a later booking) and GPUs stay idle,
  a job being started (it has not launched: no restart) moves to the fastest option of any
  GPU type the idle GPUs hold that finishes it at least ``widen_gain`` sooner. An admitted
  job moves only where it meets its deadline and where a share of it fits from now beside
  every other booking, so no promise is broken; the GPUs past that share are lent like
  grown ones, and a later booking takes them back (a shrink, charged the restart). The
  minimum share is chosen at least cost, often on a slow type; growth keeps a job on its
  type, so without this an idle fast pool stays idle while the job runs slowly.
* **Placement** is Frenzy's best fit, keeping tensor-parallel groups inside nodes.

Admission control, reservations, the greedy allocation and the handling of infeasible jobs
(``mode='reject'`` or ``'best_effort'``) are in ``scheduler.policies.deadline``.
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.estimator import StepTimeEstimator
from scheduler.perf import AnalyticalPerfModel
from scheduler.policies.deadline import (
    LAUNCH_DELAY_S,
    RESTART_DELAY_S,
    Admission,
    BookingRule,
    DeadlineConfig,
    DeadlineEngine,
    EnginePolicy,
    Growth,
    OpportunityCost,
    PlanSpace,
    Prediction,
    best_fit_place,
    best_plan_options,
)
from scheduler.policies.deadline.strategies import OPPORTUNITY_LIMIT, catalog_value, check_mode
from scheduler.policy import PerfModel, register


def elastic_config(
    *,
    mode: str = "reject",
    reserve_latest: bool = True,
    wake_s: float = 600.0,
    slack: float = 0.05,
    resize_gain_factor: float = 1.0,
    launch_delay_s: float = LAUNCH_DELAY_S,
    restart_delay_s: float = RESTART_DELAY_S,
    type_value: Callable[[str], float] | None = None,
    opportunity_cost: float | None = OPPORTUNITY_LIMIT,
    costly_mode: str = "best_effort",
    arrival_window: int = 64,
    capacity_bound: bool = True,
    refusal_guard: bool = True,
    replan: bool = True,
    estimator: StepTimeEstimator | None = None,
    within_margin: str | None = "best_effort",
    widen_gain: float | None = 0.0,
) -> DeadlineConfig:
    """``elastic`` as a composition of the deadline strategies (the arguments are
    ``ElasticPolicy``'s): every plan on any GPU type, best-fit placement; running jobs book
    the fewest GPUs that meet their deadline, on their own type when one does; admission
    weighs the opportunity cost and re-plans in deadline order; the leftovers grow or move a
    running job only when that repays its restart."""
    check_mode("costly_mode", costly_mode)
    return DeadlineConfig(
        plans=PlanSpace(best_plan_options, best_fit_place),
        prediction=Prediction(slack, launch_delay_s, restart_delay_s, estimator),
        booking=BookingRule(latest=reserve_latest, wake_s=wake_s, fewest_now=True,
                            stay_type=True, type_value=type_value or catalog_value),
        admission=Admission(
            infeasible=mode, replan=replan, within_margin=within_margin,
            opportunity=None if opportunity_cost is None else OpportunityCost(
                opportunity_cost, costly_mode, arrival_window, capacity_bound,
                refusal_guard)),
        growth=Growth(guard=True, gain_factor=resize_gain_factor, cross_type=True,
                      widen_gain=widen_gain),
    )


@register("elastic")
class ElasticPolicy(EnginePolicy):
    """Ours. ``mode``: what happens to a job whose deadline cannot be met ('reject' ends it
    with the reason, 'best_effort' keeps it queued without a guarantee); ``reserve_latest``:
    book a share as late as still meets the deadline; ``wake_s``: how soon a late booking may
    start before it is booked early instead; ``slack``: fraction of the time to the deadline
    held back as a safety margin; ``resize_gain_factor``: how many times its own cost a
    resize must save; ``launch_delay_s``, ``restart_delay_s``: what a start and a
    checkpoint-restart cost in the predictions; ``type_value``: a GPU type's weight in a
    share's cost (default: its FP16 TFLOP/s); ``opportunity_cost``: the most expected
    deadline arrivals a new job's booking may turn away (``None``: no limit);
    ``costly_mode``: what happens to a job over that limit ('best_effort' or 'reject');
    ``arrival_window``: how many recent arrivals the estimate uses; ``capacity_bound``: the
    estimate counts no more arrivals than the booking's GPUs could have served (off: the
    arrival-rate count alone, the rule before; an ablation); ``refusal_guard``: the estimate
    is scaled by how many of the arrivals predicted to use the room of earlier refusals the
    policy then admitted into it, at most 1 (off: an ablation); ``replan``: re-plan
    every booking in deadline order when an arrival does not fit (may pause running jobs
    with slack); ``estimator``: corrects remaining times from observed step times and widens
    ``slack`` by the error it has not corrected (``scheduler.estimator``; None: predictions
    taken as they are); ``within_margin``: what happens to a job refused only by the safety
    margin (an option of it is on time by the prediction; None: as ``mode``, an ablation);
    ``widen_gain``: when nobody waits and GPUs stay idle, a job being started takes the
    fastest option of any type they hold that finishes it at least this fraction sooner,
    keeping every booking (default 0: any faster option, chosen on the tuning split,
    docs/deadlines_validation.md; None: never, the rule before; ``Growth.widen_gain``);
    ``seed``: accepted for a uniform interface. The strategies these compose are in
    ``elastic_config``."""

    name = "elastic"

    def __init__(
        self,
        perf: PerfModel | None = None,
        *,
        mode: str = "reject",
        reserve_latest: bool = True,
        wake_s: float = 600.0,
        slack: float = 0.05,
        resize_gain_factor: float = 1.0,
        launch_delay_s: float = LAUNCH_DELAY_S,
        restart_delay_s: float = RESTART_DELAY_S,
        type_value: Callable[[str], float] | None = None,
        opportunity_cost: float | None = OPPORTUNITY_LIMIT,
        costly_mode: str = "best_effort",
        arrival_window: int = 64,
        capacity_bound: bool = True,
        refusal_guard: bool = True,
        replan: bool = True,
        estimator: StepTimeEstimator | None = None,
        within_margin: str | None = "best_effort",
        widen_gain: float | None = 0.0,
        seed: int = 0,
    ) -> None:
        self.perf: PerfModel = perf if perf is not None else AnalyticalPerfModel()
        self.seed = seed
        self.engine = DeadlineEngine(self.name, self.perf, elastic_config(
            mode=mode, reserve_latest=reserve_latest, wake_s=wake_s, slack=slack,
            resize_gain_factor=resize_gain_factor, launch_delay_s=launch_delay_s,
            restart_delay_s=restart_delay_s, type_value=type_value,
            opportunity_cost=opportunity_cost, costly_mode=costly_mode,
            arrival_window=arrival_window, capacity_bound=capacity_bound,
            refusal_guard=refusal_guard, replan=replan, estimator=estimator,
            within_margin=within_margin, widen_gain=widen_gain))
