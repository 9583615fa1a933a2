"""Online correction of predicted step times from observed ones (Pollux's and Sia's idea:
their schedulers re-fit each job's throughput model from the step times it reports).

Each observation is a job's measured seconds per step on a GPU type next to the predicted
seconds for the same placement; the estimator keeps the log ratio r = ln(observed /
predicted):

* per job and GPU type — the job's own latest r (an exponential average, so a noisy report
  moves it part of the way): once a job has run on a type, its remaining time there is the
  prediction × exp(r);
* per GPU type × model family, across jobs — the mean of the latest r of up to ``window``
  recent jobs, shrunk towards 0 by ``prior_jobs`` pseudo-jobs so one job does not set the
  correction for every other; used for a job not yet seen on that type;
* the error the estimator could not remove: for each job's first observation on a type, how
  far r was from the group correction in force then; ``margin`` reads a quantile of these
  (default the median: the systematic under-prediction the group correction has not caught up
  with yet) and the deadline policy widens its safety slack to it. A higher quantile guards
  against the per-job spread too, at the price of turning jobs away: in a reject-mode
  deadline policy a rejection is a certain miss (docs/simulator_error.md measures this).

Bounded: corrections are clipped to [1/``max_factor``, ``max_factor``]; per-job entries go
with ``forget``, group and spread windows keep the latest ``window`` entries. Pure: no I/O,
no clock; the control loop feeds it (``orchestrator.estimation.EstimatorFeed``).
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class _Group:
    latest: OrderedDict[str, float] = field(default_factory=OrderedDict)
    total: float = 0.0


class StepTimeEstimator:
    """See the module docstring. ``alpha``: weight of a new observation in a job's average;
    ``prior_jobs``: pseudo-jobs at r = 0 in each group mean; ``max_factor``: the largest
    correction either way; ``window``: jobs kept per group and first-errors kept for the
    margin; ``quantile``: which quantile of the under-prediction errors ``margin`` reports."""

    def __init__(self, *, alpha: float = 0.5, prior_jobs: float = 2.0, max_factor: float = 4.0,
                 window: int = 256, quantile: float = 0.5) -> None:
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if prior_jobs < 0:
            raise ValueError(f"prior_jobs must be >= 0, got {prior_jobs!r}")
        if not max_factor > 1.0:
            raise ValueError(f"max_factor must be > 1, got {max_factor!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile!r}")
        self.alpha = alpha
        self.prior_jobs = prior_jobs
        self.max_log = math.log(max_factor)
        self.window = window
        self.quantile = quantile
        self._job: dict[str, dict[str, float]] = {}
        self._groups: dict[tuple[str, str], _Group] = {}
        self._first_err: deque[float] = deque(maxlen=window)
        self.observations = 0

    def _clip(self, r: float) -> float:
        return max(-self.max_log, min(self.max_log, r))

    def observe(self, job_id: str, gpu_type: str, family: str, predicted_s: float,
                observed_s: float) -> None:
        """One measured step time of ``job_id`` on ``gpu_type`` (``family``: its model's)."""
        if not (predicted_s > 0 and observed_s > 0):
            raise ValueError(f"job {job_id}: predicted_s and observed_s must be > 0, got "
                             f"{predicted_s!r}, {observed_s!r}")
        r = self._clip(math.log(observed_s / predicted_s))
        mine = self._job.setdefault(job_id, {})
        old = mine.get(gpu_type)
        if old is None:
            # what the estimator would have assumed for this job: the group's correction
            self._first_err.append(r - self._group_log(gpu_type, family))
            new = r
        else:
            new = old + self.alpha * (r - old)
        mine[gpu_type] = new
        g = self._groups.setdefault((gpu_type, family), _Group())
        prev = g.latest.pop(job_id, None)
        if prev is not None:
            g.total -= prev
        g.latest[job_id] = new
        g.total += new
        while len(g.latest) > self.window:
            _, gone = g.latest.popitem(last=False)
            g.total -= gone
        self.observations += 1

    def _group_log(self, gpu_type: str, family: str) -> float:
        g = self._groups.get((gpu_type, family))
        if g is None or not g.latest:
            return 0.0
        return self._clip(g.total / (len(g.latest) + self.prior_jobs))

    def factor(self, job_id: str, gpu_type: str, family: str) -> float:
        """Expected observed / predicted step time of ``job_id`` on ``gpu_type``: the job's own
        when it has run there, else its GPU type × family's, else 1."""
        mine = self._job.get(job_id)
        r = mine.get(gpu_type) if mine else None
        return math.exp(r if r is not None else self._group_log(gpu_type, family))

    def margin(self) -> float:
        """The fraction of a time budget to keep in reserve against the error not yet
        corrected: 1 − exp(−q), q the ``quantile`` of the signed first-observation errors
        (0 when that quantile is not an under-prediction, or nothing was observed)."""
        if not self._first_err:
            return 0.0
        errs = sorted(self._first_err)
        q = errs[min(len(errs) - 1, int(self.quantile * len(errs)))]
        return 1.0 - math.exp(-q) if q > 0 else 0.0

    def forget(self, job_id: str) -> None:
        """The job left: drop its own entries (its group contributions stay, bounded)."""
        self._job.pop(job_id, None)
