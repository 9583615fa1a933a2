"""``/metrics`` in the Prometheus text format (version 0.0.4), computed from the database.

Every figure is read from the tables the Controller's recorder writes, so any API worker
process answers the same: queue length, jobs by state, GPUs in use and in total by GPU type,
and the placement latency (submission → first placement) as a cumulative histogram over
every job ever placed (a job's ``placed_at`` is set once, so the buckets only grow).

A scrape costs O(live jobs + jobs placed or finished lately), not O(history):

* live states are counted from the state index (``WHERE state IN (live states)``);
* the finished-job totals and the latency histogram are ``Tally`` counters kept by the
  process: everything stamped before ``now - settle_s`` is *settled* and added once (the
  first scrape adds the whole history, in one aggregate query each); what was stamped
  after is re-read on every scrape (a range on the partial ``placed_at`` / ``finished_at``
  indexes). A row that commits more than ``settle_s`` after its own timestamp would be
  missed; the Controller stamps and commits in one transaction.

Aggregates are computed in SQL (``repositories.seconds_between`` is the dialect's
timestamp difference), so no job row reaches Python.

The process that runs the control loop adds the loop's own figures (``watch_loop``): turns
made and their durations as a histogram, jobs in its working set and jobs ended. An API-only
worker process (``--workers N``) has no loop and leaves them out.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

import sqlalchemy as sa
from sqlalchemy.orm import Session

from orchestrator.states import TERMINAL, JobState
from service.db.models import AllocationRow, Job, NodeRow
from service.db.repositories import seconds_between

if TYPE_CHECKING:
    from orchestrator.loop import ControlLoop

LATENCY_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                                        300.0, 1800.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
SETTLE_S = 60.0
"""Rows stamped longer ago than this are added to the counters once, never re-read."""
LIVE_STATES = tuple(s for s in JobState if s not in TERMINAL)
_TERMINAL = tuple(s for s in JobState if s in TERMINAL)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _family(name: str, kind: str, help_text: str, samples: Iterable[str]) -> list[str]:
    return [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples]


def histogram_lines(name: str, values: Sequence[float], buckets: Sequence[float]) -> list[str]:
    """Cumulative ``_bucket`` lines, ``_sum`` and ``_count`` of ``values``."""
    ordered = sorted(values)
    counts = []
    i = 0
    for b in buckets:
        while i < len(ordered) and ordered[i] <= b:
            i += 1
        counts.append(i)
    return _histogram_text(name, buckets, counts, len(ordered), math.fsum(ordered))


def _histogram_text(name: str, buckets: Sequence[float], cumulative: Sequence[int],
                    count: int, total: float) -> list[str]:
    out = [f'{name}_bucket{{le="{b:g}"}} {n}' for b, n in zip(buckets, cumulative,
                                                               strict=True)]
    out.append(f'{name}_bucket{{le="+Inf"}} {count}')
    out.append(f"{name}_sum {total:.6f}")
    out.append(f"{name}_count {count}")
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


@dataclass
class Latency:
    """A cumulative histogram: counts at or below each bucket bound, count and sum."""

    cumulative: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS_S))
    count: int = 0
    total: float = 0.0

    def plus(self, other: Latency) -> Latency:
        return Latency([a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)],
                       self.count + other.count, self.total + other.total)


def _latency(session: Session, lo: datetime | None, hi: datetime | None) -> Latency:
    """The histogram of jobs first placed in ``[lo, hi)`` (open ends: None), in SQL (each
    wait computed once, in a materialised CTE, then counted against every bucket)."""
    dialect = session.get_bind().dialect.name
    conds = [Job.placed_at.is_not(None)]
    if lo is not None:
        conds.append(Job.placed_at >= lo)
    if hi is not None:
        conds.append(Job.placed_at < hi)
    waits = (sa.select(seconds_between(Job.placed_at, Job.created_at, dialect).label("w"))
             .where(*conds).cte("waits").prefix_with("MATERIALIZED"))
    cols = [sa.func.sum(sa.case((waits.c.w <= b, 1), else_=0)) for b in LATENCY_BUCKETS_S]
    row = session.execute(sa.select(sa.func.count(), sa.func.sum(waits.c.w), *cols)).one()
    return Latency([int(n or 0) for n in row[2:]], int(row[0] or 0), float(row[1] or 0.0))


def _finished(session: Session, lo: datetime | None, hi: datetime | None) -> dict[str, int]:
    """Jobs that finished in ``[lo, hi)``, by (terminal) state."""
    conds = [Job.finished_at.is_not(None)]  # set once, when a job ends: on the index
    if lo is not None:
        conds.append(Job.finished_at >= lo)
    if hi is not None:
        conds.append(Job.finished_at < hi)
    counts = dict.fromkeys((s.value for s in _TERMINAL), 0)
    # A materialised CTE keeps the range on the finished_at index: grouping the table
    # directly, SQLite scans the state index instead (ordered by the GROUP BY).
    ended = sa.select(Job.state).where(*conds).cte("ended").prefix_with("MATERIALIZED")
    for state, n in session.execute(
            sa.select(ended.c.state, sa.func.count()).group_by(ended.c.state)):
        if JobState(state).value in counts:
            counts[JobState(state).value] += int(n)
    return counts


class Tally:
    """The settled part of the history counters of one process (see the module doc)."""

    def __init__(self, settle_s: float = SETTLE_S) -> None:
        self.settle = timedelta(seconds=settle_s)
        self.until: datetime | None = None
        """Everything stamped before this instant is counted in ``latency``/``finished``."""
        self.latency = Latency()
        self.finished = dict.fromkeys((s.value for s in _TERMINAL), 0)
        self._lock = threading.Lock()

    def read(self, session: Session, now: datetime) -> tuple[Latency, dict[str, int]]:
        """The counters as of ``now``: the settled ones advanced to ``now - settle``, plus
        the rows stamped since (read, not kept)."""
        with self._lock:
            hi = now - self.settle
            if self.until is None or hi > self.until:
                self.latency = self.latency.plus(_latency(session, self.until, hi))
                for state, n in _finished(session, self.until, hi).items():
                    self.finished[state] += n
                self.until = hi
            settled_latency, settled_finished, since = (
                self.latency, dict(self.finished), self.until)
        recent = _finished(session, since, None)
        return (settled_latency.plus(_latency(session, since, None)),
                {s: n + recent[s] for s, n in settled_finished.items()})


def render_metrics(session: Session, tally: Tally, now: datetime) -> str:
    """The exposition text for the current database contents (``tally``: this process's
    settled counters, advanced as of ``now``)."""
    by_state = dict.fromkeys((s.value for s in JobState), 0)
    for state, n in session.execute(
            sa.select(Job.state, sa.func.count()).where(Job.state.in_(LIVE_STATES))
            .group_by(Job.state)):
        by_state[JobState(state).value] = int(n)
    latency, finished = tally.read(session, now)
    by_state.update(finished)
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
        _histogram_text("frenzy_placement_latency_seconds", LATENCY_BUCKETS_S,
                        latency.cumulative, latency.count, latency.total),
    )
    lines += loop_lines()
    return "\n".join(lines) + "\n"
