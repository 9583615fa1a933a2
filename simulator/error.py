"""Prediction error in the simulator: each job's *true* step time and peak memory.

Without an error model every job runs at exactly its predicted step time. With one, a job
placed on GPU type ``g`` runs at

    true step time = predicted step time × exp(bias_g + sigma_g · z(job, g))

where ``z`` is a standard-normal draw fixed by (seed, job id, GPU type): the same job on the
same type always has the same error (it is the model's error for that job's shape, not
run-to-run jitter), another type draws afresh. Its true peak memory is the predicted peak ×
exp(bias_m + sigma_m · z(job, "memory")). Draws are hashed, not taken from a shared random
stream, so they do not depend on the order in which jobs start.

``bias`` and ``sigma`` are in log space (ln(measured / predicted)). The ``measured`` constants
below come from ``fit_step_error`` over the measured data sets; ``2x`` doubles both (twice the
measured error in log space). The simulator's backend applies the factor; a policy never sees
it — only the prediction and the progress the backend reports.
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import NormalDist

ERROR_MODES = ("none", "measured", "2x")
POOLED = "*"
"""Key of the bias/spread used for a GPU type with no measurements of its own."""

MAX_LOG_FACTOR = math.log(4.0)
"""A drawn factor is clipped to [1/4, 4]: a tail draw stays a plausible misprediction."""


@dataclass(frozen=True, slots=True)
class LogError:
    """Bias and spread of ln(measured / predicted); ``n`` rows and ``sets`` data sets."""

    bias: float
    sigma: float
    n: int = 0
    sets: int = 0


def fit_step_error(rows: Iterable[tuple[str, str, float, float]]) -> dict[str, LogError]:
    """Per GPU type (and ``POOLED`` over all), the bias and spread of ln(measured/predicted).

    ``rows``: (gpu type, data set, predicted s, measured s). Every data set counts equally
    within a GPU type (vTrain's 1,440 A100 rows would otherwise drown the 38 gpt_pmp rows that
    disagree with them): bias = mean over the type's sets of each set's mean residual; sigma
    = sqrt(mean over those sets of (the set's variance + (set mean − bias)²)), the spread of a
    job drawn from a random set. ``POOLED`` does the same over every (type, set) group.
    """
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for gpu, dataset, pred, meas in rows:
        if not (pred > 0 and meas > 0):
            raise ValueError(f"{gpu}/{dataset}: predicted and measured must be > 0, "
                             f"got {pred!r}, {meas!r}")
        groups[(gpu, dataset)].append(math.log(meas / pred))
    if not groups:
        raise ValueError("no rows to fit an error model on")

    def combine(parts: list[list[float]]) -> LogError:
        means = [statistics.fmean(r) for r in parts]
        bias = statistics.fmean(means)
        var = statistics.fmean(statistics.pvariance(r) + (m - bias) ** 2
                               for r, m in zip(parts, means, strict=True))
        return LogError(bias, math.sqrt(var), sum(len(r) for r in parts), len(parts))

    by_gpu: dict[str, list[list[float]]] = defaultdict(list)
    for (gpu, _), res in groups.items():
        by_gpu[gpu].append(res)
    out = {gpu: combine(parts) for gpu, parts in sorted(by_gpu.items())}
    out[POOLED] = combine(list(groups.values()))
    return out


MEASURED_STEP_ERROR: dict[str, LogError] = {
    "A100-40G": LogError(bias=-0.0840, sigma=0.1951, n=1665, sets=4),
    "A100-80G": LogError(bias=0.0754, sigma=0.1176, n=71, sets=3),
    "H100-80G": LogError(bias=-0.0066, sigma=0.0878, n=70, sets=1),
    "H100-96G": LogError(bias=0.0254, sigma=0.0157, n=2, sets=1),
    "RTX2080Ti": LogError(bias=-0.0221, sigma=0.0332, n=32, sets=1),
    "T4": LogError(bias=0.7305, sigma=0.0829, n=47, sets=1),
    POOLED: LogError(bias=0.0561, sigma=0.2620, n=1887, sets=11),
}
"""Step-time error per GPU type: ``fit_step_error`` over every row of
``benchmarks.step_time_accuracy.load_cases()`` (the sets of docs/step_time_accuracy.md:
vTrain single/multi, Korthikanti, llm-foundry, Megatron papers, Sia gpt_pmp rtx/dgx-ext,
AMP T4, torchtitan) against the predictor of this commit. Regenerate with
``python -m benchmarks.step_time_accuracy --error-model``; tests/simulator/test_error.py checks
that the constants still match that fit. Types without measurements use ``POOLED``."""

MEASURED_MEMORY_ERROR = LogError(bias=math.log(1.0 - 0.006973), sigma=0.04538 * math.sqrt(
    math.pi / 2.0), n=79, sets=6)
"""Peak-memory error: the ``real`` section of docs/memory_accuracy.json (79 public real-GPU
peaks, 6 sources, leave-one-source-out; the section's 10 ``flags`` rows fit no constant):
bias −0.70 %, MAPE 4.54 %. The spread is the MAPE
read as the mean absolute deviation of a normal (sigma = MAPE · sqrt(pi/2) = 5.7 %); that file
keeps no per-row residuals to fit on, and memory data carry no GPU type."""


def _z(seed: int, *key: str) -> float:
    """A standard-normal draw fixed by ``seed`` and ``key`` (hash → uniform → inverse CDF)."""
    h = hashlib.blake2b(f"{seed}\x1f{chr(31).join(key)}".encode(), digest_size=8).digest()
    u = (int.from_bytes(h, "big") + 0.5) / 2.0**64
    return NormalDist().inv_cdf(u)


@dataclass(frozen=True, slots=True)
class ErrorModel:
    """Draws true/predicted factors; ``mode`` one of ``ERROR_MODES``, ``scale`` multiplies the
    measured bias and spread (1 for ``measured``, 2 for ``2x``, 0 for ``none``)."""

    mode: str = "none"
    seed: int = 0
    step: dict[str, LogError] = field(default_factory=lambda: dict(MEASURED_STEP_ERROR))
    memory: LogError = MEASURED_MEMORY_ERROR

    def __post_init__(self) -> None:
        if self.mode not in ERROR_MODES:
            raise ValueError(f"error mode must be one of {', '.join(ERROR_MODES)}, "
                             f"got {self.mode!r}")

    @property
    def scale(self) -> float:
        return {"none": 0.0, "measured": 1.0, "2x": 2.0}[self.mode]

    @property
    def active(self) -> bool:
        return self.mode != "none"

    def _factor(self, err: LogError, *key: str) -> float:
        s = self.scale
        if s == 0.0:
            return 1.0
        x = s * (err.bias + err.sigma * _z(self.seed, *key))
        return math.exp(max(-MAX_LOG_FACTOR, min(MAX_LOG_FACTOR, x)))

    def step_factor(self, job_id: str, gpu_type: str) -> float:
        """True / predicted step time of ``job_id`` on ``gpu_type``."""
        err = self.step.get(gpu_type) or self.step[POOLED]
        return self._factor(err, job_id, gpu_type)

    def memory_factor(self, job_id: str) -> float:
        """True / predicted peak memory of ``job_id``."""
        return self._factor(self.memory, job_id, "memory")
