"""How long a deadline job will take, and how much of its deadline is held back."""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.estimator import StepTimeEstimator
from scheduler.job import JobView
from scheduler.policies.deadline.candidates import Candidate
from scheduler.policies.deadline.options import Option

LAUNCH_DELAY_S = 10.0
"""Workers scheduled and stepping (mirrors the simulator's launch delay; kept here so the
scheduler package stays free of orchestrator imports)."""

RESTART_DELAY_S = 60.0
"""Checkpoint save + load on a restart (mirrors the simulator's restart delay)."""

MAX_SLACK = 0.3
"""The widest safety margin an estimator may widen ``slack`` to (a third of every budget
held back would turn away most deadline jobs)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """Decides a job's predicted remaining time on an option and the safety margin its
    deadline is judged with.

    A change of option costs ``launch_delay_s`` (a fresh job) or that plus
    ``restart_delay_s`` (a checkpoint-restart) before it makes steps; ``slack`` is the
    fraction of the time to the deadline held back for prediction and placement error. With
    an ``estimator``, step times are corrected by the observed / predicted ratio and the
    margin widens to the error it has not corrected, at most ``max_slack``."""

    slack: float = 0.05
    launch_delay_s: float = LAUNCH_DELAY_S
    restart_delay_s: float = RESTART_DELAY_S
    estimator: StepTimeEstimator | None = None
    max_slack: float = MAX_SLACK

    @property
    def margin(self) -> float:
        """The safety margin in force: ``slack``, widened to the estimator's margin of
        uncorrected error when it has one (at most ``max(slack, max_slack)``)."""
        if self.estimator is None:
            return self.slack
        return min(max(self.slack, self.max_slack), max(self.slack, self.estimator.margin()))

    @property
    def restart_s(self) -> float:
        """What a checkpoint-restart costs: a launch plus the restart."""
        return self.launch_delay_s + self.restart_delay_s

    def step_factor(self, job: JobView, option: Option) -> float:
        """Observed / predicted step time the estimator expects for ``job`` on ``option``'s
        GPU type (1 without an estimator)."""
        if self.estimator is None:
            return 1.0
        return self.estimator.factor(job.id, option.gpu_type, job.family)

    def overhead(self, job: JobView, option: Option, current: Option | None) -> float:
        """Seconds before ``option`` makes steps: 0 if the job already runs it, a launch for a
        fresh job, a launch plus a checkpoint-restart for a resumed or resized one."""
        if current is not None and option.same_shape(current):
            return 0.0
        if current is not None or job.steps_done > 0:
            return self.launch_delay_s + self.restart_delay_s
        return self.launch_delay_s

    def remaining_s(self, c: Candidate, option: Option, *, stopped: bool = False) -> float:
        """Predicted seconds to finish ``c`` on ``option`` from now; ``stopped``: the job is
        stopped now and resumed later (a checkpoint-restart even on its current shape)."""
        step_s = option.step_s
        if self.estimator is not None:
            step_s *= self.step_factor(c.job, option)
        if stopped and c.current is not None:
            return (c.job.remaining_steps * step_s + self.launch_delay_s
                    + self.restart_delay_s)
        return c.job.remaining_steps * step_s + self.overhead(c.job, option, c.current)

    def meets(self, c: Candidate, option: Option, now: float, *, margin: bool = True) -> bool:
        """Whether ``option`` from now finishes ``c`` by its deadline, margin held back (with
        ``margin=False``: by the deadline itself)."""
        d = c.job.deadline
        if d is None:
            return False
        held = self.margin if margin else 0.0
        return now + self.remaining_s(c, option) <= now + (d - now) * (1.0 - held)
