"""The tuning and the validation split of the workloads the simulator replays.

``has``'s thresholds (``min_gain``, ``shrink_delay``, ``min_saving_s``, the knee,
``max_slowdown``, ``widen_gain``, ``exchange_gain``) and the deadline policy's margins were
chosen by looking at the Sia Philly and Helios-Saturn workloads and the paper's NewWorkload
queues (docs/jct.md, docs/deadlines.md, docs/validation.md say so). Those are
the tuning split. Every other named trace set is the validation split, chosen by subtraction
so that a set added to ``simulator.traces.TRACE_SETS`` lands in validation unless someone
moves it here on purpose. Headline figures are medians over the validation split.

The Alibaba GPU v2023 pod trace (``alibaba-openb``, its whole-GPU pods read as training jobs,
in windows of 150 jobs; ``simulator.traces``) is split by window: its even windows are tuning
workloads (``TUNING_WINDOWS``), its odd windows validation. Without them no tuning workload
had its shape (many jobs of a minute or less on a light load), so a threshold that only such
jobs exercise could not be chosen on the tuning split at all. Its quick form is its first
window, a validation one.

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

TUNING_WINDOWS: dict[str, tuple[int, ...]] = {"alibaba-openb": tuple(range(2, 25, 2))}
"""Windows (``<set>:<k>``) of windowed validation sets that are tuning workloads; the set's
other windows are validation."""

VALIDATION: tuple[str, ...] = tuple(s for s in (*TRACE_SETS, *GAVEL_SETS) if s not in TUNING)
"""Every other named trace set (Sia newTrace, phoebe, scale and rate sets; Pollux at each
load; ElasticFlow's Philly VC; Alibaba openb's odd windows) and Gavel's generated workloads."""


def tuning_workloads() -> tuple[str, ...]:
    """What ``--split tuning`` replays: the tuning sets (every file) and the tuning windows."""
    return (*TUNING, *(f"{s}:{k}" for s, ks in TUNING_WINDOWS.items() for k in ks))


def validation_windows(name: str) -> tuple[str, ...]:
    """The validation windows of a windowed set, ``<set>:<k>`` in order."""
    from simulator.traces import load_traces

    tuning = set(TUNING_WINDOWS.get(name, ()))
    return tuple(f"{name}:{k}" for k in range(1, len(load_traces(name)) + 1) if k not in tuning)


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
