"""What a deadline policy has promised, kept between calls and across a restart.

``Ledger`` holds the jobs with a deadline guarantee (admitted), those refused one
(best-effort) and the GPU type each pinned job stays on; ``DeadlineNote`` is one job's entry
as the service stores it. Bookings are not kept: every ``decide`` makes them again from the
admitted set and the jobs' progress, so they follow from these."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from scheduler.policies.deadline.opportunity import ArrivalEntry

STATUSES = ("admitted", "best_effort")


@dataclass(frozen=True, slots=True)
class DeadlineNote:
    """What the engine keeps about one deadline job across a restart (``PolicyNote.data``).

    ``status``: 'admitted' (holds the deadline guarantee), 'best_effort' (was refused one),
    or None (seen as an arrival and rejected, or a job without a deadline pinned to a type);
    ``pinned``: the GPU type it may use (``PlanSpace.pin_type``); ``arrival``: its entry in
    the opportunity-cost window, (order of arrival, submit time, fewest GPUs per type that
    met its deadline, their GPU-seconds per type)."""

    status: str | None = None
    pinned: str | None = None
    arrival: ArrivalEntry | None = None

    def to_data(self) -> dict[str, Any]:
        """The JSON form stored with the job."""
        arr = None if self.arrival is None else [
            self.arrival[0], self.arrival[1], [[t, n] for t, n in self.arrival[2]],
            [[t, w] for t, w in self.arrival[3]]]
        return {"status": self.status, "pinned": self.pinned, "arrival": arr}

    @classmethod
    def from_data(cls, data: Mapping[str, Any]) -> DeadlineNote:
        """Read a stored note back; a malformed one raises ``ValueError`` naming the field."""
        status = data.get("status")
        if status is not None and status not in STATUSES:
            raise ValueError(f"deadline note: status {status!r} is not one of "
                             f"{', '.join(STATUSES)} or null")
        pinned = data.get("pinned")
        if pinned is not None and not isinstance(pinned, str):
            raise ValueError(f"deadline note: pinned must be a GPU type name, not {pinned!r}")
        raw = data.get("arrival")
        arrival = None
        if raw is not None:
            try:  # notes written before the GPU-seconds were kept have three fields
                seq, submit, need, *rest = raw
                if len(rest) > 1:
                    raise ValueError(raw)
                work = rest[0] if rest else ()
                arrival = (int(seq), float(submit),
                           tuple((str(t), int(n)) for t, n in need),
                           tuple((str(t), float(w)) for t, w in work))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"deadline note: arrival must be [order, submit time, "
                                 f"[[gpu type, gpus], ...], [[gpu type, GPU-seconds], ...]], "
                                 f"not {raw!r}") from exc
        return cls(status, pinned, arrival)


class Ledger:
    """The deadline promises kept between calls, and which jobs' notes changed.

    ``admitted``: ids of jobs holding a deadline guarantee (kept until they leave);
    ``best_effort``: deadline jobs refused one; ``on_time_only``: those of them refused only
    by the safety margin, kept while they can still be on time (``Admission.within_margin``;
    not across a restart: restored as plain best-effort); ``pinned``: the GPU type a job
    stays on;
    ``live``: the jobs of the last call; ``changed``: jobs whose note changed since the notes
    were last taken."""

    def __init__(self) -> None:
        self.admitted: set[str] = set()
        self.best_effort: set[str] = set()
        self.on_time_only: set[str] = set()
        self.pinned: dict[str, str] = {}
        self.live: set[str] = set()
        self.changed: set[str] = set()

    def admit(self, job_id: str) -> None:
        """Give ``job_id`` the deadline guarantee."""
        self.admitted.add(job_id)
        self.changed.add(job_id)

    def refuse(self, job_id: str, *, on_time_only: bool = False) -> None:
        """Keep ``job_id`` best-effort: it was refused a guarantee and is not asked again;
        ``on_time_only``: only while it can still be on time (see ``on_time_only``)."""
        self.best_effort.add(job_id)
        if on_time_only:
            self.on_time_only.add(job_id)
        self.changed.add(job_id)

    def pin(self, job_id: str, gpu_type: str) -> None:
        """Keep ``job_id`` on ``gpu_type`` from now on."""
        self.pinned[job_id] = gpu_type
        self.changed.add(job_id)

    def unpin(self, job_id: str) -> None:
        """Let ``job_id`` leave the GPU type it was kept on (none of its plans fit there any
        more); it is pinned again where it next books or runs."""
        if self.pinned.pop(job_id, None) is not None:
            self.changed.add(job_id)

    def status(self, job_id: str) -> str | None:
        """'admitted', 'best_effort' or None."""
        return ("admitted" if job_id in self.admitted else
                "best_effort" if job_id in self.best_effort else None)

    def forget(self, live: set[str]) -> None:
        """Drop the promises of jobs that left (finished, cancelled, rejected)."""
        self.admitted &= live
        self.best_effort &= live
        self.on_time_only &= live
        self.live = live
        if len(self.pinned) > len(live) + 1024:
            self.pinned = {k: v for k, v in self.pinned.items() if k in live}

    def restore(self, notes: Mapping[str, DeadlineNote], live: set[str]) -> None:
        """Rebuild the promises of the ``live`` jobs from their notes."""
        mine = {k: n for k, n in notes.items() if k in live}
        self.admitted = {k for k, n in mine.items() if n.status == "admitted"}
        self.best_effort = {k for k, n in mine.items() if n.status == "best_effort"}
        self.on_time_only = set()
        self.pinned = {k: n.pinned for k, n in mine.items() if n.pinned is not None}
        self.live = live
        self.changed.clear()
