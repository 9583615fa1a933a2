"""The tuning and the validation split of the workloads the simulator replays.

``has``'s thresholds (``min_gain``, ``shrink_delay``, ``min_saving_s``, the knee,
``max_slowdown``, ``widen_gain``, ``exchange_gain``) and the deadline policy's margins were
chosen by looking at the Sia Philly and Helios-Saturn workloads and the paper's NewWorkload
queues (docs/jct.md, docs/deadlines.md, docs/validation.md say so). Those are
the tuning split. Every other named trace set is the validation split, chosen by subtraction
so that a set added to ``simulator.traces.TRACE_SETS`` lands in validation unless someone
moves it here on purpose. Headline figures are medians over the validation split.

The Alibaba GPU v2023 pod trace (``alibaba-openb``, its whole-GPU pods read as training jobs,
in windows of 150 jobs; ``simulator.traces``) is validation: nothing was tuned on it. Its
quick form is its first window.

Gavel publishes no trace (its folder holds throughput matrices): its simulations generate jobs,
and ``simulator.gavel`` reproduces that generator; the workloads ``simulator.gavel.GAVEL_SETS``
(1 and 2 jobs an hour) are validation too. The Alibaba PAI 2020 folder holds a machine list
only, so it is in neither split.
"""

from __future__ import annotations

from simulator.gavel import GAVEL_SETS
from simulator.traces import TRACE_SETS

TUNING: tuple[str, ...] = ("sia-philly", "sia-saturn", "newworkload-30", "newworkload-60")
"""Workloads the policies' thresholds were tuned on."""

VALIDATION: tuple[str, ...] = tuple(s for s in (*TRACE_SETS, *GAVEL_SETS) if s not in TUNING)
"""Every other named trace set (Sia newTrace, phoebe, scale and rate sets; Pollux at each
load; ElasticFlow's Philly VC; Alibaba openb) and Gavel's generated workloads."""


def first_files(sets: tuple[str, ...]) -> tuple[str, ...]:
    """One workload per set (``<set>:1`` for a folder of ``workload-<k>.csv`` files or a
    windowed set, the set itself for a single file; a ``<set>:<k>`` stays as it is): the quick
    form of a split."""
    from simulator.gavel import parse_spec
    from simulator.traces import TRACE_WINDOWS, trace_files

    out = []
    for s in sets:
        if parse_spec(s) is not None:  # a generated workload is one workload
            out.append(s)
            continue
        if s in TRACE_WINDOWS:
            out.append(f"{s}:1")
            continue
        files = trace_files(s)
        out.append(f"{s}:{files[0].stem.split('-')[-1]}" if len(files) > 1
                   and files[0].stem.startswith("workload-") else s)
    return tuple(out)
