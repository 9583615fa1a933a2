"""The working records of one ``decide`` call: every job as a ``Candidate``, and the ``Round``
the phases pass along (time, capacity, candidates, the booking profile)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.cluster import Allocation
from scheduler.decision import Decision
from scheduler.job import JobView
from scheduler.policies.deadline.bookings import Profile, Share
from scheduler.policies.deadline.options import Option


@dataclass(slots=True)
class Candidate:
    """One job in this call: its options, what it holds, and what the phases give it.

    ``target`` is the option it ends the call on (None: not running); ``mandatory``: the
    target is its booking starting now; ``reserved``: its booking; ``fixed_type``: the one
    GPU type it may use (``PlanSpace.pin_type``); ``on_time_only``: a best-effort job that
    starts only on an option finishing by its deadline (``Admission.within_margin``);
    ``narrow``: the option it got before a wide start (``LeftoverFill.widen``), placed
    instead when the wide one cannot be; ``why``: the reasons, in phase order, that its
    decision's text joins."""

    job: JobView
    options: Mapping[str, tuple[Option, ...]]
    current: Option | None  # what it holds now (running jobs)
    held: Allocation | None
    target: Option | None = None
    mandatory: bool = False
    reserved: Share | None = None
    fixed_type: str | None = None
    on_time_only: bool = False
    narrow: Option | None = None
    why: list[str] = field(default_factory=list)

    def types(self) -> list[str]:
        """The GPU types it may run on."""
        if self.fixed_type is not None:
            return [self.fixed_type] if self.fixed_type in self.options else []
        return list(self.options)


def deadline_order(c: Candidate) -> tuple[float, float, str]:
    """Earliest deadline first, then arrival, then id (the jobs must have deadlines)."""
    assert c.job.deadline is not None
    return (c.job.deadline, c.job.submit_time, c.job.id)


@dataclass(slots=True)
class Round:
    """What the phases of one ``decide`` call share: the time, the GPUs per type, every
    candidate by id (a rejected arrival leaves it), the booking profile (replaced by a
    re-plan), the candidates holding a booking, and the rejections made."""

    now: float
    cap: Mapping[str, int]
    cands: dict[str, Candidate]
    profile: Profile
    booked: list[Candidate] = field(default_factory=list)
    rejected: list[Decision] = field(default_factory=list)
