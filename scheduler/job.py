"""What a policy sees of a job: its ranked plans, its request, its progress and deadline."""

from __future__ import annotations

from dataclasses import dataclass, field

from predictor.plan import Plan
from predictor.spec import ModelSpec, TrainingSpec
from scheduler.cluster import Allocation


@dataclass(frozen=True, slots=True)
class JobView:
    """A job as the scheduler sees it. Times are seconds on the controller's clock.

    ``plans`` are the predictor's ranked plans (best first). ``requested_gpus`` /
    ``requested_gpu_type`` are what the user (or the trace) asked for, used by baselines
    that take the user's own request. ``steps_done`` counts finished optimizer steps.
    """

    id: str
    submit_time: float
    plans: tuple[Plan, ...]
    total_steps: int
    model: ModelSpec | None = None
    train: TrainingSpec | None = None
    steps_done: float = 0.0
    requested_gpus: int | None = None
    requested_gpu_type: str | None = None
    deadline: float | None = None  # absolute time on the controller's clock
    priority: int = 0
    restarts: int = 0
    extra: dict[str, object] = field(default_factory=dict, compare=False, hash=False)

    @property
    def remaining_steps(self) -> float:
        return max(0.0, self.total_steps - self.steps_done)

    @property
    def remaining_fraction(self) -> float:
        return self.remaining_steps / self.total_steps if self.total_steps else 0.0

    @property
    def family(self) -> str:
        """The model family its step-time error is pooled under across jobs
        (``scheduler.estimator``); "" when it carries no model."""
        return str(self.model.family) if self.model is not None else ""


@dataclass(frozen=True, slots=True)
class RunningJob:
    """A job holding GPUs: its allocation and since when it has held it."""

    job: JobView
    allocation: Allocation
    started_at: float
