"""``/metrics`` in the Prometheus text format (version 0.0.4), computed from the database.

Every figure is read from the tables the Controller's recorder writes, so any API worker
process answers the same: queue length, jobs by state, GPUs in use and in total by GPU type,
and the placement latency (submission → first placement) as a cumulative histogram over
every job ever placed (a job's ``placed_at`` is set once, so the buckets only grow).

The process that runs the control loop adds the loop's own figures (``watch_loop``): turns
made and their durations as a histogram, jobs in its working set and jobs ended. An API-only
worker process (``--workers N``) has no loop and leaves them out.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.models import AllocationRow, Job, NodeRow

if TYPE_CHECKING:
    from orchestrator.loop import ControlLoop

LATENCY_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                                        300.0, 1800.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def histogram_lines(name: str, values: Sequence[float], buckets: Sequence[float]) -> list[str]:
    """Cumulative ``_bucket`` lines, ``_sum`` and ``_count`` of ``values``."""
    out = []
    ordered = sorted(values)
    i = 0
    for b in buckets:
        while i < len(ordered) and ordered[i] <= b:
            i += 1
        out.append(f'{name}_bucket{{le="{b:g}"}} {i}')
    out.append(f'{name}_bucket{{le="+Inf"}} {len(ordered)}')
    out.append(f"{name}_sum {math.fsum(ordered):.6f}")
    out.append(f"{name}_count {len(ordered)}")
    return out


_watched: list[ControlLoop] = []
_watched_lock = threading.Lock()


def watch_loop(loop: ControlLoop | None) -> None:
    """Report ``loop``'s figures in this process's ``/metrics`` (None: stop reporting)."""
    with _watched_lock:
        _watched[:] = [loop] if loop is not None else []


def loop_lines() -> list[str]:
    """The watched loop's figures: turns and their durations (histogram over every turn,
    fixed buckets, so a window's quantile is read from the difference of two scrapes), jobs
    in its working set (live) and jobs ended."""
    from orchestrator.loop import TURN_BUCKETS_S

    with _watched_lock:
        loop = _watched[0] if _watched else None
    if loop is None:
        return []
    with loop.lock:  # a consistent snapshot: the loop thread updates these in its turn
        stats = loop.stats
        hist = list(stats.turn_hist)
        total_s = stats.turn_s_sum
        live = len(loop.controller.live)
        ended = loop.controller.ended.total()
    name = "frenzy_loop_turn_seconds"
    samples, cum = [], 0
    for b, n in zip(TURN_BUCKETS_S, hist, strict=False):
        cum += n
        samples.append(f'{name}_bucket{{le="{b:g}"}} {cum}')
    cum += hist[-1]
    samples += [f'{name}_bucket{{le="+Inf"}} {cum}', f"{name}_sum {total_s:.6f}",
                f"{name}_count {cum}"]
    lines = _family(name, "histogram", "Wall seconds of the control loop's turns.", samples)
    lines += _family("frenzy_loop_live_jobs", "gauge",
                     "Jobs in the control loop's working set (not yet ended).",
                     [f"frenzy_loop_live_jobs {live}"])
    lines += _family("frenzy_loop_ended_jobs_total", "counter",
                     "Jobs the control loop has seen end.",
                     [f"frenzy_loop_ended_jobs_total {ended}"])
    return lines


def render_metrics(session: Session) -> str:
    """The exposition text for the current database contents."""
    by_state = repo.count_jobs_by_state(session=session)
    capacity: dict[str, int] = {}
    for gpu_type, total in session.execute(
        sa.select(NodeRow.gpu_type, sa.func.sum(NodeRow.total_gpus))
        .where(NodeRow.alive.is_(True)).group_by(NodeRow.gpu_type)
    ):
        capacity[gpu_type] = int(total or 0)
    used: dict[str, int] = dict.fromkeys(capacity, 0)
    for gpu_type, gpus in session.execute(
        sa.select(AllocationRow.gpu_type, sa.func.sum(AllocationRow.gpus))
        .where(AllocationRow.released_at.is_(None)).group_by(AllocationRow.gpu_type)
    ):
        used[gpu_type] = int(gpus or 0)
    latencies = [
        (placed - created).total_seconds()
        for created, placed in session.execute(
            sa.select(Job.created_at, Job.placed_at).where(Job.placed_at.is_not(None))
        )
    ]
    lines: list[str] = []
    lines += _family("frenzy_queue_length", "gauge", "Jobs waiting for GPUs (PENDING).",
                     [f"frenzy_queue_length {by_state[JobState.PENDING.value]}"])
    lines += _family("frenzy_jobs", "gauge", "Jobs by state.",
                     [f'frenzy_jobs{{state="{s}"}} {n}' for s, n in sorted(by_state.items())])
    lines += _family("frenzy_gpus_in_use", "gauge", "GPUs allocated to jobs, by GPU type.",
                     [f'frenzy_gpus_in_use{{gpu_type="{_label(t)}"}} {n}'
                      for t, n in sorted(used.items())])
    lines += _family("frenzy_gpus_total", "gauge", "GPUs of live nodes, by GPU type.",
                     [f'frenzy_gpus_total{{gpu_type="{_label(t)}"}} {n}'
                      for t, n in sorted(capacity.items())])
    lines += _family(
        "frenzy_placement_latency_seconds", "histogram",
        "Seconds from submission to a job's first placement.",
        histogram_lines("frenzy_placement_latency_seconds", latencies, LATENCY_BUCKETS_S),
    )
    lines += loop_lines()
    return "\n".join(lines) + "\n"
