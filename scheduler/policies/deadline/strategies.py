"""The strategies a deadline policy is composed of: each decides one thing.

``DeadlineConfig`` holds one of each; ``elastic`` and ``elasticflow`` are two compositions
(see their modules). ``PlanSpace`` (``options``) and ``Prediction`` (``prediction``) are the
other two strategies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.policies.deadline.options import PlanSpace
from scheduler.policies.deadline.prediction import Prediction

MODES = ("reject", "best_effort")
"""What may happen to a deadline job that is refused a guarantee: it is rejected (ends with
the reason, never runs) or runs best-effort on leftovers."""


def check_mode(what: str, mode: str) -> None:
    """Raise ``ValueError`` unless ``mode`` is one of ``MODES``."""
    if mode not in MODES:
        raise ValueError(f"{what} must be one of {MODES}, got {mode!r}")


def catalog_value(gpu_type: str) -> float:
    """A GPU type's value for cost weighting: dense FP16 TFLOP/s from the catalog (1 if
    unknown)."""
    try:
        from predictor.gpus import get_gpu

        return float(get_gpu(gpu_type).fp16_tflops)
    except (KeyError, ValueError):
        return 1.0


@dataclass(frozen=True, slots=True)
class BookingRule:
    """Decides which share a job books and when it is held.

    A share's cost is its GPU-seconds weighted by ``type_value`` (A100-equivalent GPU-time),
    and the cheapest share that meets the deadline is booked. ``latest``: held as late as
    still meets the deadline (the near future stays free for arrivals), unless it would start
    within ``wake_s`` (the next call may come too late), else as early as the profile has
    room (ElasticFlow). For a running job's share from now, ``fewest_now`` books only the
    fewest GPUs of each type that meet the deadline (near-linear scaling makes every size
    cost about the same, and the largest would hold GPUs an arrival needs), and
    ``stay_type`` prefers its current GPU type (moving to a slower, cheaper type lengthens
    its run)."""

    latest: bool = False
    wake_s: float = 600.0
    fewest_now: bool = False
    stay_type: bool = False
    type_value: Callable[[str], float] = catalog_value


OPPORTUNITY_LIMIT = 1.25
"""``OpportunityCost.limit``'s default, and ``elastic``'s: expected deadline arrivals a
booking may turn away (chosen on the tuning split: docs/deadlines.md)."""


@dataclass(frozen=True, slots=True)
class OpportunityCost:
    """Decides whether a booking costs more deadline arrivals than it is worth.

    The deadline ratio counts jobs, so a booking is worth one job. An arrival whose every
    share would turn away more than ``limit`` expected deadline arrivals (estimated from the
    last ``window`` arrivals, see ``opportunity.ArrivalWindow``) is not booked but handled as
    ``costly`` says (one of ``MODES``), and every share is chosen to turn away the fewest.
    ``capacity_bound``: count no more arrivals than the booking's GPUs could have served
    (off: the arrival-rate count alone, which under overload counts arrivals that would be
    turned away whatever is booked). ``guard``: scale the count by how many of the arrivals
    predicted to use the room of earlier refusals were admitted into it, at most 1
    (``opportunity.RefusalAccount``): refusals stop when the policy's own bookings do not
    bear the prediction out."""

    limit: float = OPPORTUNITY_LIMIT
    costly: str = "best_effort"
    window: int = 64
    capacity_bound: bool = True
    guard: bool = True

    def __post_init__(self) -> None:
        check_mode("costly_mode", self.costly)


@dataclass(frozen=True, slots=True)
class Admission:
    """Decides which deadline arrivals get a guarantee.

    An arrival is admitted when a minimum satisfactory share fits beside every booking (and,
    with ``opportunity``, costs at most its limit); one that fits nowhere is handled as
    ``infeasible`` says (one of ``MODES``). ``within_margin`` (one of ``MODES``; None: as
    ``infeasible``) handles an arrival refused only by the safety margin: an option of it
    finishes by the deadline on the prediction, none with the margin held back. The margin
    protects the guarantees given; rejecting such a job turns a possible hit into a certain
    miss. Kept best-effort, it starts on leftovers only on an option that is on time, and
    is rejected once, still waiting, none is (it neither starts on GPUs it would be late
    on nor queues for a certain miss). With ``replan``, an arrival that does not fit beside
    the bookings (or an admitted job left without a share) re-plans every booking in
    deadline order, pausing running jobs with slack; ElasticFlow admits only into what the
    bookings leave."""

    infeasible: str = "reject"
    replan: bool = False
    opportunity: OpportunityCost | None = None
    within_margin: str | None = None

    def __post_init__(self) -> None:
        check_mode("mode", self.infeasible)
        if self.within_margin is not None:
            check_mode("within_margin", self.within_margin)


@dataclass(frozen=True, slots=True)
class Growth:
    """Decides when the leftover GPUs may grow or move a running job.

    With ``guard``, a running job is grown only when the predicted time saved exceeds
    ``gain_factor`` × the checkpoint-restart it costs (ElasticFlow treats scaling as cheap:
    no guard). With ``cross_type``, the leftovers may move a running job onto a faster option
    of another GPU type (under the same guard). With ``widen_gain``, when nobody waits after
    the leftovers are handed out, a job being started (it has not launched: no restart) moves
    to the fastest option of any type the idle GPUs hold that finishes it at least
    ``widen_gain`` sooner, keeping every booking (``LeftoverFill.widen``); None: never."""

    guard: bool = True
    gain_factor: float = 1.0
    cross_type: bool = False
    widen_gain: float | None = None

    def __post_init__(self) -> None:
        if self.widen_gain is not None and not 0.0 <= self.widen_gain < 1.0:
            raise ValueError(f"widen_gain must be None or in [0, 1), got {self.widen_gain!r}")


@dataclass(frozen=True, slots=True)
class DeadlineConfig:
    """A deadline policy: one strategy per question (see each)."""

    plans: PlanSpace
    prediction: Prediction
    booking: BookingRule
    admission: Admission
    growth: Growth
