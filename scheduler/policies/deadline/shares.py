"""Which share a deadline job books: its minimum satisfactory share.

The cheapest option (GPU-seconds weighted by the type's value) that finishes the job by its
deadline within what the profile leaves free; a running job's share starts now (a later one
would stop it), and a running job on time never loses what it holds to another's booking."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from scheduler.policies.deadline.bookings import Profile, Share, ticks_ceil, ticks_floor
from scheduler.policies.deadline.candidates import Candidate
from scheduler.policies.deadline.opportunity import ArrivalWindow
from scheduler.policies.deadline.prediction import Prediction
from scheduler.policies.deadline.strategies import BookingRule, OpportunityCost


def reserve(c: Candidate, share: Share, profile: Profile) -> None:
    """Book ``share`` for ``c`` in ``profile``; a share starting now becomes its target."""
    profile.reserve(share.option.gpu_type, share.option.num_gpus, share.start, share.end)
    c.reserved = share
    if share.start <= profile.now:
        c.target = share.option
        c.mandatory = True


class Booker:
    """Finds shares by the ``BookingRule`` (when, which size, which type), with the
    ``Prediction`` of each option's time and, with an ``OpportunityCost``, the arrivals each
    would turn away (priced by ``window``)."""

    def __init__(self, rule: BookingRule, prediction: Prediction,
                 opportunity: OpportunityCost | None, window: ArrivalWindow) -> None:
        self.rule = rule
        self.prediction = prediction
        self.opportunity = opportunity
        self.window = window
        self._value_cache: dict[str, float] = {}

    def value(self, gpu_type: str) -> float:
        """The type's value for cost weighting (``BookingRule.type_value``, cached)."""
        v = self._value_cache.get(gpu_type)
        if v is None:
            v = self._value_cache[gpu_type] = self.rule.type_value(gpu_type)
        return v

    def min_share(self, c: Candidate, profile: Profile, now: float, cap: Mapping[str, int], *,
                  arrival: bool = False) -> Share | None:
        """The cheapest option (value-weighted GPU-seconds) that finishes ``c`` by its
        deadline within what ``profile`` leaves free; ties: the earlier finish.

        Reserved from the earliest time the profile has room, or with ``BookingRule.latest``
        from the latest time that still meets the deadline (the near future stays free for
        arrivals; the job runs earlier on leftovers when there are any). A late reservation
        needs a policy call by its start: one starting within ``wake_s`` (at least the tick
        interval) is reserved as early as possible instead.

        With an opportunity cost, the share that turns away the fewest expected arrivals
        (``displaced``, to 0.1) is preferred, then the cheapest; for an ``arrival`` being
        admitted, an option turning away more than the limit is passed over for more GPUs of
        its type (a shorter booking), and if every option does, the one turning away the
        fewest is returned (the caller then does not reserve it)."""
        job = c.job
        assert job.deadline is not None
        budget = job.deadline - now
        if budget <= 0:
            return None
        pred, oc = self.prediction, self.opportunity
        latest = now + budget * (1.0 - pred.margin)
        latest_k = ticks_floor(latest)
        wake_k = ticks_floor(now + self.rule.wake_s)
        best: tuple[tuple[float, float, int], Share] | None = None
        costly: tuple[float, Share] | None = None
        for t in c.types():
            if t not in profile.cap:
                continue
            w = self.value(t)
            for o in c.options[t]:
                # a running job whose share starts later is stopped until then: restart charged
                dur = pred.remaining_s(c, o, stopped=True)
                if now + dur > latest:
                    continue  # too slow at this size: try more GPUs
                dur_k = ticks_ceil(dur)
                s = None
                if self.rule.latest:
                    s = profile.latest_fit(t, o.num_gpus, dur_k, latest_k)
                    if s is not None and s < wake_k:
                        s = None  # too close to wait for: the next call may come too late
                if s is None:
                    s = profile.earliest_fit(t, o.num_gpus, dur_k, latest_k)
                if s is None:
                    continue
                cost = w * o.num_gpus * dur
                cand = Share(o, s, s + dur_k, cost)
                lost = 0.0
                if oc is not None:
                    lost = self.window.displaced(cand, cap, profile)
                    if arrival and lost > oc.limit:
                        if costly is None or lost < costly[0]:
                            costly = (lost, cand)
                        continue  # turns away too many arrivals: try more GPUs (shorter)
                key = (round(lost, 1), cost, cand.end)
                if best is None or key < best[0]:
                    best = (key, cand)
                break  # fewest GPUs of this type that meet the deadline
        if best is None and costly is not None:
            return costly[1]
        return best[1] if best is not None else None

    def now_share(self, c: Candidate, profile: Profile, now: float,
                  cap: Mapping[str, int]) -> Share | None:
        """A running admitted job's minimum share, starting now (a share starting later would
        stop it, taking away what it holds): the cheapest option, its current one preferred
        on ties, that finishes by the deadline with the safety margin and fits the profile
        from now (a different option is a resize, charged the restart). With
        ``BookingRule.fewest_now`` only the fewest GPUs of each type that meet it are
        candidates, with ``stay_type`` its current type comes first, and with an opportunity
        cost the option turning away the fewest expected arrivals comes before both."""
        job = c.job
        assert job.deadline is not None and c.current is not None
        budget = job.deadline - now
        if budget <= 0:
            return None
        pred, rule = self.prediction, self.rule
        latest = now + budget * (1.0 - pred.margin)
        latest_k = ticks_floor(latest)
        now_k = profile.now
        best: tuple[tuple[float, bool, float, int, bool], Share] | None = None
        for t in c.types():
            if t not in profile.cap:
                continue
            w = self.value(t)
            for o in c.options[t]:
                dur = pred.remaining_s(c, o)
                if now + dur > latest:
                    continue
                dur_k = ticks_ceil(dur)
                s = profile.earliest_fit(t, o.num_gpus, dur_k, latest_k)
                if s is None or s > now_k:
                    continue
                cost = w * o.num_gpus * dur
                sh = Share(o, now_k, now_k + dur_k, cost)
                lost = 0.0
                if self.opportunity is not None:
                    lost = self.window.displaced(sh, cap, profile)
                key = (round(lost, 1), rule.stay_type and t != c.current.gpu_type, cost, sh.end,
                       not o.same_shape(c.current))
                if best is None or key < best[0]:
                    best = (key, sh)
                if rule.fewest_now:
                    break  # the fewest GPUs of this type that meet the deadline from now
        return best[1] if best is not None else None

    def keep_share(self, c: Candidate, now: float) -> Share | None:
        """Its current option from now, if that finishes by the deadline itself (no margin:
        keeping it costs no restart, and a job on time is never stopped for the margin)."""
        cur = c.current
        assert cur is not None and c.job.deadline is not None
        dur = self.prediction.remaining_s(c, cur)
        if now + dur > c.job.deadline:
            return None
        now_k = ticks_floor(now)
        return Share(cur, now_k, now_k + ticks_ceil(dur),
                     self.value(cur.gpu_type) * cur.num_gpus * dur)

    def book_running(self, running: Sequence[Candidate], profile: Profile, now: float,
                     cap: Mapping[str, int]) -> list[Candidate]:
        """Running admitted jobs reserve first, from now. Each on time first holds its current
        option (they all fit: they run now); then, in deadline order, each gives that back and
        takes its cheapest option from now, or keeps the current one when nothing cheaper
        fits. So no admitted job on time loses what it holds, whatever the others take.
        Returns the jobs left without a share from now."""
        keep: dict[str, Share] = {}
        for c in running:
            sh = self.keep_share(c, now)
            if sh is not None:
                profile.reserve(sh.option.gpu_type, sh.option.num_gpus, sh.start, sh.end)
                keep[c.job.id] = sh
        left: list[Candidate] = []
        for c in running:
            k = keep.get(c.job.id)
            if k is not None:
                profile.reserve(k.option.gpu_type, -k.option.num_gpus, k.start, k.end)
            share = self.now_share(c, profile, now, cap) or k
            if share is None:
                left.append(c)
                continue
            if share is k and not self.prediction.meets(c, k.option, now):
                c.why.append("keeps its GPUs: on time, within the safety margin")
            reserve(c, share, profile)
        return left
