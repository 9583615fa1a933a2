"""The engine behind the deadline-aware elastic policies (``elastic`` and ``elasticflow``).

Both follow ElasticFlow's structure (Gu et al., ASPLOS'23) and are two compositions of the
same strategies (``strategies.DeadlineConfig``): what a job may run on (``PlanSpace``), how
long it takes (``Prediction``), which share it books (``BookingRule``), who is admitted
(``Admission``, with an optional ``OpportunityCost``) and when the leftovers grow a running
job (``Growth``).

1. **Admission control with minimum satisfactory shares** (``admission``, ``shares``). Every
   admitted deadline job, in order of deadline (EDF), reserves its *minimum satisfactory
   share*: the cheapest option (GPU type, count, plan) that finishes its remaining steps by
   its deadline, held from the earliest time the cluster has room for it. Admitted jobs that
   are running reserve first, from now (a share starting later would stop them), so one on
   time never loses what it holds. Reservations live in a per-GPU-type ``Profile`` of
   promised GPUs over time (``bookings``). A new job is checked against the profile *after*
   every admitted job has reserved, so admitting it never takes anything promised away; a
   job no option can satisfy is rejected or kept as best-effort (``Admission.infeasible``;
   ``Admission.within_margin`` for one refused only by the safety margin), with the reason.
   A share may be reserved as early as possible (ElasticFlow) or as late as possible
   (``BookingRule.latest``; ``elastic``'s default), which keeps the near future free for
   short jobs while a long job advances on leftovers.
2. **Allocation now** (``allocation``, ``leftovers``). Jobs whose reservation starts now get
   it; running jobs keep what they hold when it still fits (no restart for nothing); the
   leftover GPUs go greedily where the predicted marginal gain is largest: ``Δ(1/T) /
   ΔGPUs``, the increase in the job's completion rate (T = its predicted remaining time) per
   added GPU, with diminishing returns because the options are the job's step times at each
   size. Best-effort jobs (no deadline, or rejected-as-best-effort, or admitted jobs that fell
   behind) share these leftovers.
3. **Resizes cost a checkpoint-restart** (``prediction``). Any change of a running job's
   option is charged ``launch_delay_s + restart_delay_s`` in its predicted time, and with
   ``Growth.guard`` a running job is only grown when the time saved exceeds ``gain_factor``
   × that cost.
4. **Opportunity cost** (``opportunity``; ``elastic`` only). The deadline ratio counts jobs,
   so a booking is worth one job; admitting a long job whose share holds most of a pool
   turns away the short arrivals that needed it. With an ``OpportunityCost``, an arrival
   whose every share would turn away more than its limit of expected arrivals (observed
   arrival rate × the fraction of recent arrivals that what the booking leaves free could no
   longer serve, integrated over the booking, and at most as many as the booking's
   GPU-seconds could have served of them, scaled by how many of the arrivals predicted to
   use the room of earlier refusals were then admitted into it) is kept best-effort
   instead of reserved
   (Moore–Hodgson's rule for counting on-time jobs: give up the long job to keep many short
   ones), and shares are chosen to turn away the fewest.
5. **Deadline-order re-plan** (``Admission.replan``; ``elastic`` only). Bookings are made
   running jobs first, then in arrival order, so a job due in half an hour is refused
   whenever one due tomorrow holds the GPUs. With ``replan``, an arrival that does not fit
   beside the bookings makes every booking again in deadline order: a running job with slack
   may be *paused* (stopped, its booking resuming it in time with the restart charged) so
   that the earlier deadline fits. It is admitted only if every job booked before still is.
   The same re-plan rescues an admitted job that the running-first order leaves without a
   share. Every admitted job therefore always holds a booking that meets its deadline; what
   it holds *now* may change. ElasticFlow admits only into what the bookings leave.

The cost of an option, for choosing the minimum share across GPU types, is its GPU-seconds
weighted by the type's value (dense FP16 TFLOP/s from the GPU catalog): "A100-equivalent
GPU-time", so a job that gains little from fast GPUs takes a slow type and leaves the fast
ones to jobs that need them.

Simplifications (documented in docs/deadlines.md): a reservation is one fixed option over one
interval (ElasticFlow's slot-by-slot shares may vary over time); the profile counts GPUs per
type and ignores which node they are on (placement happens afterwards, and a placement that
splits a tensor-parallel group is re-timed by the performance model).
"""

from scheduler.policies.deadline.bookings import (
    TICKS_PER_S,
    Profile,
    Share,
    tick_seconds,
    ticks_ceil,
    ticks_floor,
)
from scheduler.policies.deadline.engine import DeadlineEngine, EnginePolicy
from scheduler.policies.deadline.ledger import DeadlineNote
from scheduler.policies.deadline.options import (
    Option,
    PlanSpace,
    best_fit_place,
    best_plan_options,
    pareto,
)
from scheduler.policies.deadline.prediction import (
    LAUNCH_DELAY_S,
    MAX_SLACK,
    RESTART_DELAY_S,
    Prediction,
)
from scheduler.policies.deadline.strategies import (
    Admission,
    BookingRule,
    DeadlineConfig,
    Growth,
    OpportunityCost,
)

__all__ = [
    "LAUNCH_DELAY_S", "MAX_SLACK", "RESTART_DELAY_S", "TICKS_PER_S", "Admission",
    "BookingRule", "DeadlineConfig", "DeadlineEngine", "DeadlineNote", "EnginePolicy",
    "Growth", "OpportunityCost", "Option", "PlanSpace", "Prediction", "Profile", "Share",
    "best_fit_place", "best_plan_options", "pareto", "tick_seconds", "ticks_ceil",
    "ticks_floor",
]
