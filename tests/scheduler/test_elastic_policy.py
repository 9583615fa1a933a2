"""The elastic deadline-aware policy (ours) and the ElasticFlow baseline: admission control,
minimum satisfactory shares kept, leftovers by marginal gain, resizes that pay for themselves,
moves between GPU types, and the invariants (hypothesis): capacity never exceeded and no
admitted job's minimum share ever taken away."""

from __future__ import annotations

import pytest
from builders import (
    IdentityPerf,
    apply_decisions,
    assert_allocation_valid,
    assert_reason_codes,
    cluster,
    make_node,
    make_plan,
    ranked,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cluster import Allocation, ClusterState
from scheduler.decision import DecisionKind, ReasonCode
from scheduler.job import JobView, RunningJob
from scheduler.policies.deadline import (
    TICKS_PER_S,
    Option,
    Profile,
    Share,
    ticks_ceil,
    ticks_floor,
)
from scheduler.policy import make_policy

POLICIES = ["elastic", "elasticflow"]


def job(job_id: str, plans, *, deadline: float | None, steps: int = 100, submit: float = 0.0,
        done: float = 0.0) -> JobView:
    return JobView(id=job_id, submit_time=submit, plans=tuple(plans), total_steps=steps,
                   steps_done=done, deadline=deadline, requested_gpus=1)


def scaling(gpu_type: str, counts=(1, 2, 4, 8), base: float = 8.0, eff: float = 0.9):
    """Plans of one type whose step time falls as base / n^eff (diminishing returns)."""
    return [make_plan(gpu_type, n, step_s=base / n ** eff) for n in counts]


def a100(n: int = 1, per: int = 8) -> ClusterState:
    return cluster(*[make_node(f"a{i}", "A100-40G", per) for i in range(n)])


def reasons(decisions, kind: DecisionKind) -> dict[str, str]:
    return {d.job_id: d.reason for d in decisions if d.kind is kind}


def test_registered() -> None:
    from scheduler.policy import policy_names

    assert {"elastic", "elasticflow"} <= set(policy_names())


def test_profile_earliest_and_latest_fit() -> None:
    p = Profile(0, {"X": 4})  # ticks
    p.reserve("X", 3, 0, 100)
    assert p.earliest_fit("X", 1, 50, 1000) == 0
    assert p.earliest_fit("X", 2, 50, 1000) == 100
    assert p.earliest_fit("X", 2, 50, 120) is None
    assert p.latest_fit("X", 2, 50, 1000) == 950
    p.reserve("X", 2, 900, 1000)
    assert p.latest_fit("X", 3, 50, 1000) == 850
    assert p.latest_fit("X", 3, 850, 1000) is None  # [0,100) and [900,...) are busy
    assert p.used_at("X", 950) == 2


def test_profile_latest_fit_ends_exactly_where_the_busy_segment_starts() -> None:
    """The crash of issue 14: in float seconds, start = e - d and start + d landed one unit past
    e, inside the busy segment, and the reservation raised. In ticks the arithmetic is exact:
    the share found free is reserved without overflow, and ends exactly at the segment."""
    e_s, d_s = 38331.50305265253, 996.5051918570789
    assert (e_s - d_s) + d_s > e_s  # the float arithmetic that crashed
    cap = {"A100-40G": 8}
    e, d = ticks_floor(e_s), ticks_ceil(d_s)
    assert (e, d) == (38_331_503_052, 996_505_192)
    p = Profile(0, cap)
    p.reserve("A100-40G", 8, e, e + 5_000)
    s = p.latest_fit("A100-40G", 8, d, e + 10)
    assert s == e - d
    p.reserve("A100-40G", 8, s, s + d)  # raised ValueError before integer time
    assert p.used_at("A100-40G", e - 1) == 8 and p.used_at("A100-40G", e) == 8


def test_seconds_become_ticks_conservatively() -> None:
    """Instants round down (a deadline never moves later), durations up (a booking never
    holds less than its work); 1 tick = 1 µs."""
    assert TICKS_PER_S == 1_000_000
    assert ticks_floor(1.0000009) == 1_000_000 and ticks_ceil(1.0000001) == 1_000_001
    assert ticks_floor(1e9) == 10 ** 15 and ticks_ceil(1e-7) == 1
    assert Share(Option("X", 1, make_plan("X", 1)), 31_000_000, 201_000_000, 0.0).end_t == 201.0


def test_rejects_an_impossible_deadline_with_the_reason() -> None:
    # fastest option: 8 GPUs, 8/8^0.9 ≈ 1.23 s/step × 100 steps ≈ 123 s > 60 s
    pol = make_policy("elastic", perf=IdentityPerf())
    out = pol.decide(a100(), [job("j", scaling("A100-40G"), deadline=60.0)], [], 0.0)
    assert [d.kind for d in out] == [DecisionKind.REJECT]
    assert "fastest option needs" in out[0].reason


def test_best_effort_mode_keeps_the_job_and_runs_it() -> None:
    pol = make_policy("elastic", perf=IdentityPerf(), mode="best_effort")
    out = pol.decide(a100(), [job("j", scaling("A100-40G"), deadline=60.0)], [], 0.0)
    assert [d.kind for d in out] == [DecisionKind.START]
    assert "best-effort" in out[0].reason


def test_admission_respects_what_is_promised() -> None:
    """Two jobs each needing the whole node by the same deadline: the first is admitted, the
    second rejected because the first's share is promised."""
    plans = scaling("A100-40G")
    # 100 steps at 8 GPUs ≈ 123 s + 10 s launch; the deadline allows one such run, not two
    a = job("a", plans, deadline=200.0)
    b = job("b", plans, deadline=200.0, submit=1.0)
    pol = make_policy("elastic", perf=IdentityPerf())
    out = pol.decide(a100(), [a, b], [], 0.0)
    assert reasons(out, DecisionKind.START).keys() == {"a"}
    assert "promised" in reasons(out, DecisionKind.REJECT)["b"]


def test_leftovers_go_where_the_marginal_gain_is_largest() -> None:
    """One job scales well, one barely: the spare GPUs go to the one that scales."""
    good = [make_plan("A100-40G", n, step_s=8.0 / n) for n in (1, 2, 4)]
    poor = [make_plan("A100-40G", n, step_s=8.0 / n ** 0.1) for n in (1, 2, 4)]
    pol = make_policy("elastic", perf=IdentityPerf())
    pend = [job("good", good, deadline=None), job("poor", poor, deadline=None)]
    out = pol.decide(a100(per=6), pend, [], 0.0)
    got = {d.job_id: d.allocation.num_gpus for d in out if d.allocation is not None}
    assert got["good"] > got["poor"] and sum(got.values()) <= 6


def test_no_resize_for_a_gain_smaller_than_its_cost() -> None:
    """A job with 30 s left on 1 GPU is not grown onto idle GPUs (a restart costs 70 s); a job
    with hours left is."""
    plans = scaling("A100-40G", counts=(1, 2, 4, 8), base=1.0, eff=1.0)
    state = a100()
    short = job("short", plans, deadline=None, steps=30)
    long = job("long", plans, deadline=None, steps=30_000)
    for j, expect in ((short, False), (long, True)):
        alloc = Allocation(j.id, plans[0], (("a0", 1),))
        st_ = state.allocate(alloc)
        pol = make_policy("elastic", perf=IdentityPerf())
        out = pol.decide(st_, [], [RunningJob(j, alloc, 0.0)], 10.0)
        assert any(d.kind is DecisionKind.RESIZE for d in out) is expect, out
        if expect:
            assert "checkpoint-restart" in out[0].reason


def test_moves_a_job_to_another_gpu_type_when_that_meets_its_deadline() -> None:
    """A job running on slow GPUs whose deadline needs the fast ones is moved there."""
    slow = [make_plan("RTX2080Ti", n, step_s=8.0 / n) for n in (1, 2)]
    fast = [make_plan("A100-40G", n, step_s=1.0 / n) for n in (1, 2)]
    j = job("j", ranked(*slow, *fast), deadline=500.0, steps=200)
    state = cluster(make_node("r0", "RTX2080Ti", 2), make_node("a0", "A100-40G", 2))
    pol = make_policy("elastic", perf=IdentityPerf())
    first = pol.decide(state, [j], [], 0.0)  # admitted: the A100s meet 500 s
    (d,) = first
    assert d.kind is DecisionKind.START and d.allocation.plan.gpu_type == "A100-40G"
    # the same job found running on the RTX GPUs (e.g. placed by an earlier policy) is moved
    pol2 = make_policy("elastic", perf=IdentityPerf())
    pol2.engine.ledger.admitted.add("j")
    alloc = Allocation("j", slow[1], (("r0", 2),))
    out = pol2.decide(state.allocate(alloc), [], [RunningJob(j, alloc, 0.0)], 0.0)
    (d,) = out
    assert d.kind is DecisionKind.RESIZE and d.allocation.plan.gpu_type == "A100-40G"


def test_leftovers_move_a_running_job_onto_faster_idle_gpus_when_that_pays() -> None:
    """A job on 2 RTX GPUs (4 s/step) with idle A100s (0.5 s/step on 2): with 1,000 steps
    left it needs 4,000 s where it is and 500 s + a 70 s restart on the A100s, so ``elastic``
    moves it; with 20 steps left both take 80 s and it stays. ``elasticflow`` keeps a job on
    the type it started on."""
    slow = [make_plan("RTX2080Ti", n, step_s=8.0 / n) for n in (1, 2)]
    fast = [make_plan("A100-40G", n, step_s=1.0 / n) for n in (1, 2)]
    state = cluster(make_node("r0", "RTX2080Ti", 2), make_node("a0", "A100-40G", 2))
    for steps, moved in ((1000, True), (20, False)):
        j = job("j", ranked(*slow, *fast), deadline=None, steps=steps)
        alloc = Allocation("j", slow[1], (("r0", 2),))
        run = state.allocate(alloc)
        out = make_policy("elastic", perf=IdentityPerf()).decide(
            run, [], [RunningJob(j, alloc, 0.0)], 0.0)
        got = [d.allocation.plan.gpu_type for d in out if d.kind is DecisionKind.RESIZE]
        assert got == (["A100-40G"] if moved else []), out
        ef = make_policy("elasticflow", perf=IdentityPerf()).decide(
            run, [], [RunningJob(j, alloc, 0.0)], 0.0)
        assert all(d.allocation is None or d.allocation.plan.gpu_type == "RTX2080Ti"
                   for d in ef), ef


def test_a_running_job_on_time_keeps_its_gpus_when_an_earlier_deadline_waits() -> None:
    """Regression (hypothesis): j0 runs on the whole node on leftovers, admitted with a 1-GPU
    share; j1 (earlier deadline) waits for its reservation after j0's. Re-reserving in
    deadline order used to put j1 first from now and stop j0 ("its GPUs are promised"):
    running admitted jobs now reserve first, from now, and j1 still fits after j0."""
    def plans(base: float, eff: float):
        return ranked(*(make_plan("RTX6000", n, step_s=base / n ** eff) for n in (1, 2, 4, 8)))

    state = cluster(make_node("n0", "RTX6000", 4))
    j0 = job("j0", plans(1.0, 1.0), deadline=90.0, steps=10)
    j1 = job("j1", plans(3.0, 0.5), deadline=89.0, steps=36, submit=1.0)
    for name in POLICIES:
        pol = make_policy(name, perf=IdentityPerf())
        first = {d.job_id: d for d in pol.decide(state, [j0, j1], [], 0.0)}
        assert first["j0"].kind is DecisionKind.START and "j1" not in first
        alloc = first["j0"].allocation
        out = pol.decide(state.allocate(alloc), [j1], [RunningJob(j0, alloc, 0.0)], 1.0)
        assert all(d.job_id != "j0" or d.kind is not DecisionKind.STOP for d in out), out
        assert {"j0", "j1"} <= pol.engine.ledger.admitted


def test_an_arrival_due_soon_is_admitted_by_pausing_a_running_job_with_slack() -> None:
    """L runs on all 4 GPUs, due at t=300: 100 steps at 4/n s per step on n GPUs, so from
    t=1 it needs 2 GPUs (200 s + 70 s restart <= 0.95 × 299 s). S arrives due at t=43: only 4
    GPUs finish it in time (20 steps × 1 s + 10 s launch = 30 s <= 0.95 × 42 s; 2 GPUs take
    50 s). Booked in arrival order (ElasticFlow, or ``replan=False``) S cannot fit beside L's
    2 GPUs and is rejected. In deadline order S runs first and L is paused: it resumes on 4
    GPUs at t=31 and is done by 31 + 100 + 70 = 201 <= 300."""
    lin = ranked(*(make_plan("RTX6000", n, step_s=4.0 / n) for n in (1, 2, 4)))
    state = cluster(make_node("n0", "RTX6000", 4))
    big = lin[-1]
    assert big.num_gpus == 4
    L = job("L", lin, deadline=300.0, steps=100)
    S = job("S", lin, deadline=43.0, steps=20, submit=1.0)
    for name, kw, paused in (("elastic", {}, True), ("elastic", {"replan": False}, False),
                             ("elasticflow", {}, False)):
        pol = make_policy(name, perf=IdentityPerf(), **kw)
        (d,) = pol.decide(state, [L], [], 0.0)
        assert d.kind is DecisionKind.START and d.allocation.num_gpus == 4, d
        alloc = d.allocation
        out = {d.job_id: d for d in pol.decide(state.allocate(alloc), [S],
                                               [RunningJob(L, alloc, 0.0)], 1.0)}
        if not paused:
            assert out["S"].kind is DecisionKind.REJECT and "promised" in out["S"].reason
            assert out["S"].code is ReasonCode.REJECT
            assert "L" not in out
            continue
        assert out["S"].kind is DecisionKind.START and out["S"].allocation.num_gpus == 4
        assert "deadline order" in out["S"].reason and out["S"].code is ReasonCode.ADMIT
        assert out["L"].kind is DecisionKind.STOP and "paused until t=31s" in out["L"].reason
        assert out["L"].code is ReasonCode.PAUSE
        booked = pol.engine.bookings["L"]
        assert (booked.start_t, booked.end_t, booked.option.num_gpus) == (31.0, 201.0, 4)
        assert {"L", "S"} <= pol.engine.ledger.admitted


def _share(gpu_type: str, n: int, start: float, end: float) -> Share:
    return Share(Option(gpu_type, n, make_plan(gpu_type, n)), ticks_floor(start),
                 ticks_floor(end), 0.0)


def test_displaced_counts_the_arrivals_a_booking_turns_away() -> None:
    """9 arrivals 10 s apart (rate 8/80 s = 0.1/s), each needing 8 of the 16 A100s: a 100 s
    booking of all 16 turns away 0.1 × 100 = 10 expected arrivals, one of 8 none; while 8 are
    already promised for its first 50 s, an 8-GPU booking turns away 0.1 × 50 = 5."""
    eng = make_policy("elastic", perf=IdentityPerf()).engine
    for i in range(9):
        eng.window.record(10.0 * i, {"A100-40G": 8})
    cap = {"A100-40G": 16}
    empty = Profile(ticks_floor(100.0), cap)
    assert eng.window.displaced(_share("A100-40G", 16, 100.0, 200.0), cap, empty) == 10.0
    assert eng.window.displaced(_share("A100-40G", 8, 100.0, 200.0), cap, empty) == 0.0
    busy = Profile(ticks_floor(100.0), cap)
    busy.reserve("A100-40G", 8, ticks_floor(100.0), ticks_floor(150.0))
    assert eng.window.displaced(_share("A100-40G", 8, 100.0, 200.0), cap, busy) == 5.0


def test_displaced_leaves_out_arrivals_another_type_could_serve() -> None:
    """4 of 9 arrivals could also run on 8 free RTX GPUs: only 5/9 of 10 are turned away."""
    eng = make_policy("elastic", perf=IdentityPerf()).engine
    for i in range(9):
        eng.window.record(10.0 * i, {"A100-40G": 8, **({"RTX2080Ti": 8} if i < 4 else {})})
    cap = {"A100-40G": 16, "RTX2080Ti": 8}
    got = eng.window.displaced(_share("A100-40G", 16, 100.0, 200.0), cap,
                               Profile(ticks_floor(100.0), cap))
    assert abs(got - 0.1 * 100.0 * 5 / 9) < 1e-9
    few = make_policy("elastic", perf=IdentityPerf()).engine
    for i in range(7):  # fewer than 8 arrivals seen: no estimate
        few.window.record(10.0 * i, {"A100-40G": 8})
    assert few.window.displaced(_share("A100-40G", 16, 100.0, 200.0), cap,
                         Profile(ticks_floor(100.0), cap)) == 0.0


def test_displaced_is_at_most_what_the_booked_gpus_could_have_served() -> None:
    """9 arrivals 10 s apart, each needing 8 of the 16 A100s for 400 s (3,200 GPU-seconds):
    a 100 s booking of all 16 blocks 0.1/s × 100 s = 10 expected arrivals, but its 1,600
    GPU-seconds could have served half of one, so it turns away 0.5 (10 without the bound).
    With 5 of them needing 100 s (800 GPU-seconds) they come in a mix of mean 16,800 / 9 =
    1,866.7 GPU-seconds: 1,600 / 1,866.7 = 0.857. An arrival with no GPU-seconds recorded
    counts in full: 1/9 of the 10, plus 0.5 of the rest."""
    cap = {"A100-40G": 16}
    empty = Profile(ticks_floor(100.0), cap)
    booking = _share("A100-40G", 16, 100.0, 200.0)
    for bound, want in ((True, 0.5), (False, 10.0)):
        eng = make_policy("elastic", perf=IdentityPerf(), capacity_bound=bound).engine
        for i in range(9):
            eng.window.record(10.0 * i, {"A100-40G": 8}, work={"A100-40G": 3200.0})
        assert eng.window.displaced(booking, cap, empty) == pytest.approx(want)
    mixed = make_policy("elastic", perf=IdentityPerf()).engine
    for i in range(9):
        mixed.window.record(10.0 * i, {"A100-40G": 8},
                            work={"A100-40G": 800.0 if i % 2 == 0 else 3200.0})
    assert mixed.window.displaced(booking, cap, empty) == pytest.approx(1600 * 9 / 16800)
    unknown = make_policy("elastic", perf=IdentityPerf()).engine
    for i in range(9):
        unknown.window.record(10.0 * i, {"A100-40G": 8},
                              work={"A100-40G": 3200.0} if i else None)
    assert unknown.window.displaced(booking, cap, empty) == pytest.approx(10 / 9 + 0.5)


def test_refusals_are_priced_by_how_many_predicted_arrivals_were_admitted() -> None:
    """By hand, 16 A100s: x's share (16 GPUs over [100, 500) s) is refused on a prediction
    of 8 arrivals using its room. At 300 s half its interval has passed, 4 were predicted
    and none admitted: the factor is 0/4. An admitted share of 8 GPUs over [300, 400) s would
    not have fitted beside x's (16 + 8 > 16): 1 of 4, 0.25; one that fits beside it (32
    GPUs) does not count. Once x's interval is over, 1 of 8. Until one arrival is predicted,
    and without the guard, the factor is 1."""
    from scheduler.policies.deadline.opportunity import RefusalAccount

    def at(t: float) -> int:
        return ticks_floor(t)

    acct = RefusalAccount()
    assert acct.factor(at(100.0)) == 1.0
    acct.refuse(_share("A100-40G", 16, 100.0, 500.0), 8.0)
    assert acct.factor(at(120.0)) == 1.0  # 8 × 20 / 400 = 0.4 predicted so far
    assert acct.factor(at(300.0)) == 0.0
    acct.admitted(_share("A100-40G", 8, 300.0, 400.0), Profile(at(300.0), {"A100-40G": 32}))
    assert acct.factor(at(300.0)) == 0.0
    acct.admitted(_share("A100-40G", 8, 300.0, 400.0), Profile(at(300.0), {"A100-40G": 16}))
    assert acct.factor(at(300.0)) == pytest.approx(0.25)
    assert acct.factor(at(600.0)) == pytest.approx(1 / 8)
    off = RefusalAccount(guard=False)
    off.refuse(_share("A100-40G", 16, 100.0, 500.0), 8.0)
    assert off.factor(at(300.0)) == 1.0


def test_a_long_job_holding_the_whole_pool_is_kept_best_effort_while_short_jobs_arrive() -> None:
    """Ten short jobs arrive 10 s apart, each met only by 8 of the 16 A100s (8 GPUs: 10 s of
    steps + 10 s launch within a 25 s deadline, 160 GPU-seconds; 4 GPUs: 30 s). Then a long
    job whose only satisfying share is all 16 for 1,010 s (16,160 GPU-seconds): 10/100 s ×
    1,010 s = 101 arrivals are expected over that booking, and in the mix they come in (the
    window: ten short ones and this long one, 17,760 / 11 GPU-seconds each) its GPU-seconds
    could have served 16,160 × 11 / 17,760 = 10.0 of them, more than the limit of 1, so it runs
    best-effort instead of being reserved. Without the opportunity cost (ElasticFlow's
    admission) it is admitted."""
    state = a100(n=2)
    shorts = scaling("A100-40G", counts=(1, 2, 4, 8), base=8.0, eff=1.0)
    longs = scaling("A100-40G", counts=(1, 2, 4, 8, 16), base=8.0, eff=1.0)
    long_job = job("long", longs, deadline=1200.0, steps=2000, submit=100.0)
    for oc, admitted in ((1.0, False), (None, True)):
        pol = make_policy("elastic", perf=IdentityPerf(), opportunity_cost=oc)
        for i in range(10):
            t = 10.0 * i
            (d,) = pol.decide(state, [job(f"s{i}", shorts, deadline=t + 25.0, steps=10,
                                          submit=t)], [], t)
            assert d.kind is DecisionKind.START and "admitted: minimum" in d.reason, d
            assert d.allocation.num_gpus >= 8
        (d,) = pol.decide(state, [long_job], [], 100.0)
        assert d.kind is DecisionKind.START
        assert ("long" in pol.engine.ledger.admitted) is admitted
        if not admitted:
            assert "best-effort" in d.reason and "turn away ~10.0 expected" in d.reason, d


def test_elasticflow_uses_power_of_two_data_parallel_options_on_one_type() -> None:
    plans = ranked(*(make_plan("A100-40G", n, step_s=8.0 / n) for n in (1, 2, 3, 4, 6, 8)),
                   make_plan("A100-40G", 4, tp=2, step_s=0.5))
    pol = make_policy("elasticflow", perf=IdentityPerf())
    out = pol.decide(a100(), [job("j", plans, deadline=None)], [], 0.0)
    (d,) = out
    p = d.allocation.plan
    assert p.parallel.tp == 1 and p.parallel.pp == 1 and p.num_gpus in (1, 2, 4, 8)


@pytest.mark.parametrize("deadline", [None, 5_000.0])
def test_elasticflow_moves_a_job_whose_pinned_type_lost_every_plan(
        deadline: float | None) -> None:
    """An out-of-memory re-plan leaves the job only plans of another GPU type: ElasticFlow
    keeps a job on the type it was admitted to or started on, but that pool can no longer
    run it, so it is unpinned and started where its plans still fit (and pinned there)."""
    state = cluster(make_node("v0", "V100-32G", 4), make_node("a0", "A100-80G", 4))
    v100, a100 = make_plan("V100-32G", 4, step_s=1.0), make_plan("A100-80G", 4, step_s=2.0)
    pol = make_policy("elasticflow", perf=IdentityPerf())
    (first,) = pol.decide(state, [job("j", ranked(v100, a100), deadline=deadline)], [], 0.0)
    assert first.kind is DecisionKind.START and first.allocation.plan.gpu_type == "V100-32G"
    pol.take_notes()
    # the first step ran out of memory: only the A100 plan is left, the job waits again
    again = job("j", ranked(a100), deadline=deadline)
    (d,) = pol.decide(state, [again], [], 10.0)
    assert d.kind is DecisionKind.START and d.allocation.plan.gpu_type == "A100-80G"
    assert "no plan of it fits V100-32G any more (re-planned): may move to A100-80G" \
        in d.reason
    (note,) = pol.take_notes()
    assert note.job_id == "j" and note.data["pinned"] == "A100-80G"


def test_a_booking_held_late_is_the_start_the_policy_holds_a_job_until() -> None:
    """k (4 GPUs, 100 steps of 1 s) takes the node now; j (1 GPU at best 8 s a step) is booked
    as late as meets its deadline: it must end by 100000 × (1 − 0.05) = 95000 s after a 10 s
    launch and 800 s of steps, so from 94190 s; it waits until then (``holds_until``)."""
    from scheduler.policy import holds_until

    state = a100(per=4)
    j = job("j", ranked(*scaling("A100-40G", (1, 2, 4), eff=1.0)), deadline=100_000.0)
    k = job("k", ranked(make_plan("A100-40G", 4, step_s=1.0)), deadline=100_000.0)
    pol = make_policy("elastic", perf=IdentityPerf())
    out = pol.decide(state, [j, k], [], 0.0)
    assert [(d.kind, d.job_id) for d in out] == [(DecisionKind.START, "k")]
    assert holds_until(pol) == pytest.approx(94_190.0)
    assert pol.decide(state, [], [], 1.0) == [] and holds_until(pol) is None


# -- invariants -------------------------------------------------------------------------------

TYPES = [("A100-40G", 8), ("RTX2080Ti", 8), ("RTX6000", 4)]


@st.composite
def scenario(draw):
    nodes = [make_node(f"n{i}", *draw(st.sampled_from(TYPES))) for i in
             range(draw(st.integers(1, 4)))]
    state = ClusterState(nodes=tuple(nodes))
    types = sorted({n.gpu_type for n in nodes})

    def plans():
        out = []
        for t in draw(st.lists(st.sampled_from(types), min_size=1, max_size=2, unique=True)):
            base = draw(st.floats(0.5, 5.0))
            eff = draw(st.floats(0.3, 1.0))
            out += [make_plan(t, n, step_s=base / n ** eff) for n in (1, 2, 4, 8)]
        return ranked(*out)

    jobs = []
    for i in range(draw(st.integers(1, 8))):
        steps = draw(st.integers(10, 3000))
        ps = plans()
        # no deadline, any deadline, or one a few times the job's fastest run (ElasticFlow's
        # λ·duration): tight arrivals beside running jobs with slack, which may be paused
        fastest = 10.0 + steps * min(p.step_time_s for p in ps)
        ddl = draw(st.one_of(st.none(), st.floats(30.0, 20_000.0),
                             st.floats(1.2, 6.0).map(lambda lam, f=fastest: lam * f)))
        submit = draw(st.sampled_from([float(i), 100.0 * i]))  # together, or one per call
        ddl = None if ddl is None else submit + ddl
        jobs.append(job(f"j{i}", ps, deadline=ddl, steps=steps, submit=submit))
    times = draw(st.lists(st.floats(1.0, 600.0), min_size=1, max_size=5))
    return state, jobs, times


def _predicted_finish(pol, j: JobView, alloc: Allocation, now: float, moved: bool) -> float:
    eng = pol.engine
    delay = eng.prediction.restart_s if moved else 0.0
    return now + delay + j.remaining_steps * alloc.plan.step_time_s


@settings(max_examples=400, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenario(), name=st.sampled_from([*POLICIES, "elastic+history", "elastic+narrow"]),
       history=st.lists(st.tuples(st.sampled_from([t for t, _ in TYPES]),
                                  st.sampled_from([1, 2, 4, 8])), min_size=8, max_size=12))
def test_capacity_never_exceeded_and_minimum_shares_kept(sc, name, history) -> None:
    """Drive the policy over a few calls (jobs progressing between them, as the controller
    would): every decision list applies within capacity; the admitted jobs' bookings fit the
    cluster at every instant and each ends by its job's deadline; and an admitted job that was
    running on time is never stopped, nor resized onto something that misses its deadline,
    unless it holds a booking that still finishes it in time (paused for earlier deadlines).
    ``elastic+history``: ``elastic`` having seen earlier arrivals, so that its opportunity
    cost is at work (some arrivals kept best-effort, shares chosen by it); ``elastic+narrow``:
    without wide starts (``widen_gain=None``)."""
    state, jobs, gaps = sc
    kw = {"widen_gain": None} if name.endswith("+narrow") else {}
    pol = make_policy(name.split("+")[0], perf=IdentityPerf(), **kw)
    if name.endswith("+history"):
        for i, (t, n) in enumerate(history):
            pol.engine.window.record(-10.0 * (len(history) - i), {t: n})
    _drive_and_check(pol, state, jobs, gaps)


@st.composite
def slack_then_tight(draw):
    """One node; a long job due far off (λ ∈ [2, 8] times its fastest run) arrives first,
    then short jobs due soon (λ ∈ [1.1, 2]): the case where ``elastic`` pauses a running job
    with slack so that an arrival due earlier fits."""
    t, per = draw(st.sampled_from(TYPES))
    state = cluster(make_node("n0", t, per))

    def plans():
        base, eff = draw(st.floats(0.5, 5.0)), draw(st.floats(0.6, 1.0))
        return ranked(*(make_plan(t, n, step_s=base / n ** eff) for n in (1, 2, 4, 8)
                        if n <= per))

    def make(i: int, submit: float, lam) -> JobView:
        ps, steps = plans(), draw(st.integers(10, 3000))
        fastest = 10.0 + steps * min(p.step_time_s for p in ps)
        return job(f"j{i}", ps, deadline=submit + draw(lam) * fastest, steps=steps,
                   submit=submit)

    jobs = [make(0, 0.0, st.floats(2.0, 8.0))]
    for i in range(1, draw(st.integers(1, 4)) + 1):
        jobs.append(make(i, draw(st.floats(1.0, 900.0)), st.floats(1.1, 2.0)))
    times = draw(st.lists(st.floats(1.0, 300.0), min_size=2, max_size=6))
    return state, jobs, times


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sc=slack_then_tight(), wide=st.booleans())
def test_pausing_for_an_earlier_deadline_keeps_every_guarantee(sc, wide) -> None:
    """The same invariants where ``elastic`` re-plans in deadline order and pauses running
    jobs (see the test above); ``elastic`` only, since ElasticFlow never pauses; ``wide``:
    with wide starts (the default) or without."""
    state, jobs, gaps = sc
    kw = {} if wide else {"widen_gain": None}
    _drive_and_check(make_policy("elastic", perf=IdentityPerf(), **kw), state, jobs, gaps)


def _drive_and_check(pol, state: ClusterState, jobs: list[JobView], gaps: list[float]) -> None:
    """Call ``pol`` at the arrivals' times and after each gap, applying its decisions and
    advancing the running jobs at their plans' pace, and check the invariants after each
    call (see ``test_capacity_never_exceeded_and_minimum_shares_kept``)."""
    future = sorted(jobs, key=lambda j: j.submit_time)
    pending: list[JobView] = []
    running: list[RunningJob] = []
    now = 0.0
    for gap in gaps:
        pending += [j for j in future if j.submit_time <= now]
        future = [j for j in future if j.submit_time > now]
        out = pol.decide(state, pending, running, now)
        assert_reason_codes(out, running)
        applied = apply_decisions(state, running, [d for d in out
                                                   if d.kind is not DecisionKind.REJECT])
        for alloc in applied.holding.values():
            assert_allocation_valid(state, alloc)
        for n in applied.state.nodes:
            assert 0 <= n.free_gpus <= n.total_gpus
        kinds = {d.job_id: d for d in out}
        books = pol.engine.bookings
        profile = Profile(ticks_floor(now), state.total_by_type())
        for jid, sh in books.items():
            assert jid in pol.engine.ledger.admitted
            profile.reserve(sh.option.gpu_type, sh.option.num_gpus, sh.start, sh.end)
            deadline = next(j.deadline for j in [*pending, *(r.job for r in running)]
                            if j.id == jid)
            assert sh.start >= ticks_floor(now) and sh.end <= ticks_floor(deadline), (jid, sh)
        for rj in running:
            j = rj.job
            if j.id not in pol.engine.ledger.admitted or j.deadline is None:
                continue
            on_time = _predicted_finish(pol, j, rj.allocation, now, False) <= j.deadline
            if not on_time:
                continue
            d = kinds.get(j.id)
            if d is not None and j.id in books and books[j.id].start > ticks_floor(now):
                assert d.kind is not DecisionKind.START, d  # paused: resumes on its booking
                continue
            assert d is None or d.kind is not DecisionKind.STOP, d
            if d is not None and d.kind is DecisionKind.RESIZE:
                assert _predicted_finish(pol, j, d.allocation, now, True) <= j.deadline, d
        # advance: running jobs progress at their plan's pace
        state = applied.state
        rejected = {d.job_id for d in out if d.kind is DecisionKind.REJECT}
        by_id = {j.id: j for j in pending} | {r.job.id: r.job for r in running}
        nxt: list[RunningJob] = []
        for jid, alloc in applied.holding.items():
            j = by_id[jid]
            was = next((r for r in running if r.job.id == jid), None)
            moved = was is None or was.allocation != alloc
            ran = max(0.0, gap - (80.0 if moved else 0.0))
            done = min(float(j.total_steps), j.steps_done + ran / alloc.plan.step_time_s)
            if done >= j.total_steps:
                state = state.release(alloc)
                continue
            from dataclasses import replace

            nxt.append(RunningJob(replace(j, steps_done=done), alloc, now))
        held = set(applied.holding)
        pending = [j for j in by_id.values() if j.id not in held and j.id not in rejected
                   and any(j.id == p.id for p in pending + [r.job for r in running])]
        pending = [p for p in pending if p.remaining_steps > 0]
        running = nxt
        now += gap


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sc=scenario(), name=st.sampled_from(POLICIES))
def test_deterministic(sc, name) -> None:
    state, jobs, _ = sc
    a = make_policy(name, perf=IdentityPerf()).decide(state, jobs, [], 0.0)
    b = make_policy(name, perf=IdentityPerf()).decide(state, jobs, [], 0.0)
    assert [(d.kind, d.job_id, d.allocation) for d in a] == \
        [(d.kind, d.job_id, d.allocation) for d in b]


def test_a_costly_arrival_rejected_in_reject_mode_says_so_in_its_code() -> None:
    """As above (ten short jobs 10 s apart, each needing 8 of 16 A100s), with
    ``costly_mode='reject'``: the long job that would hold all 16 for 1,010 s (~10.0 expected
    arrivals turned away, limit 1) is rejected with ``TOO_COSTLY``, where one that fits
    nowhere is rejected with ``REJECT``; the short ones start on their bookings (``ADMIT``)."""
    state = a100(n=2)
    shorts = scaling("A100-40G", counts=(1, 2, 4, 8), base=8.0, eff=1.0)
    longs = scaling("A100-40G", counts=(1, 2, 4, 8, 16), base=8.0, eff=1.0)
    pol = make_policy("elastic", perf=IdentityPerf(), opportunity_cost=1.0,
                      costly_mode="reject")
    for i in range(10):
        t = 10.0 * i
        (d,) = pol.decide(state, [job(f"s{i}", shorts, deadline=t + 25.0, steps=10, submit=t)],
                          [], t)
        assert (d.kind, d.code) == (DecisionKind.START, ReasonCode.ADMIT), d
    (d,) = pol.decide(state, [job("long", longs, deadline=1200.0, steps=2000, submit=100.0)],
                      [], 100.0)
    assert (d.kind, d.code) == (DecisionKind.REJECT, ReasonCode.TOO_COSTLY), d
    # 2,000 steps at 0.5 s on all 16 GPUs take 1,010 s: a 500 s deadline cannot be met
    (d,) = pol.decide(state, [job("late", longs, deadline=600.0, steps=2000, submit=100.0)],
                      [], 100.0)
    assert (d.kind, d.code) == (DecisionKind.REJECT, ReasonCode.REJECT), d
    assert "even its fastest option needs 1010s" in d.reason


def test_a_job_refused_only_by_the_safety_margin_runs_best_effort() -> None:
    """Due at t=100 on one A100 (its only plan): at 0.88 s per step its 100 steps and the
    10 s launch take 98 s, on time but past the 95 s the 5 % margin leaves: ``elastic`` runs
    it best-effort on leftovers (``FILL``) instead of rejecting it; with
    ``within_margin=None`` (the ablation) and in ``elasticflow`` it is rejected. At 0.92 s
    per step (102 s) it is late on the prediction itself and rejected by all three."""
    state = a100()
    for step_s, name, kw, runs in ((0.88, "elastic", {}, True),
                                   (0.88, "elastic", {"within_margin": None}, False),
                                   (0.88, "elasticflow", {}, False),
                                   (0.92, "elastic", {}, False)):
        j = job("j", [make_plan("A100-40G", 1, step_s=step_s)], deadline=100.0)
        pol = make_policy(name, perf=IdentityPerf(), **kw)
        (d,) = pol.decide(state, [j], [], 0.0)
        if runs:
            assert (d.kind, d.code) == (DecisionKind.START, ReasonCode.FILL), d
            assert "admitted best-effort" in d.reason and "without the safety margin" in \
                d.reason
            assert "j" in pol.engine.ledger.best_effort
        else:
            assert (d.kind, d.code) == (DecisionKind.REJECT, ReasonCode.REJECT), (step_s, d)


def test_a_job_kept_within_the_margin_starts_only_on_time_and_is_let_go_when_it_cannot() -> None:
    """Due at t=100, 100 steps: on 1 A100 at 1.6 s per step it takes 170 s (late), on 2 at
    0.88 s 98 s (on time, but past the 95 s the margin leaves): kept best-effort. On 8 free
    GPUs it starts on the 2 (the leftovers' marginal gain alone would pick the 1: 1/170 per
    GPU against 1/196). With one GPU free (a job without a deadline holds the other) it
    waits; at t=5 the 2 GPUs would finish at 103 s, so it is rejected, never having run."""
    plans = ranked(make_plan("A100-40G", 1, step_s=1.6), make_plan("A100-40G", 2, step_s=0.88))
    j = job("j", plans, deadline=100.0)
    pol = make_policy("elastic", perf=IdentityPerf())
    (d,) = pol.decide(a100(), [j], [], 0.0)
    assert (d.kind, d.code, d.allocation.num_gpus) == (DecisionKind.START, ReasonCode.FILL, 2)
    state = cluster(make_node("a0", "A100-40G", 2))
    x = job("x", [make_plan("A100-40G", 1, step_s=1.0)], deadline=None, steps=10_000)
    alloc = Allocation("x", x.plans[0], (("a0", 1),))
    held = state.allocate(alloc)
    pol = make_policy("elastic", perf=IdentityPerf())
    assert pol.decide(held, [j], [RunningJob(x, alloc, 0.0)], 0.0) == []
    assert "j" in pol.engine.ledger.best_effort and "j" in pol.engine.ledger.on_time_only
    (d,) = pol.decide(held, [j], [RunningJob(x, alloc, 0.0)], 5.0)
    assert (d.kind, d.code) == (DecisionKind.REJECT, ReasonCode.REJECT), d
    assert "any more" in d.reason
    assert "j" not in pol.engine.ledger.best_effort


def test_a_job_without_a_deadline_starts_on_leftovers_with_fill() -> None:
    """No deadline, no booking: its start is the leftovers' (``FILL``), on the fastest option
    of the free 8 GPUs (diminishing returns still pay: the only job)."""
    (d,) = make_policy("elastic", perf=IdentityPerf()).decide(
        a100(), [job("j", scaling("A100-40G"), deadline=None)], [], 0.0)
    assert (d.kind, d.code, d.allocation.num_gpus) == (DecisionKind.START, ReasonCode.FILL, 8)


def test_unknown_modes_are_refused_by_name() -> None:
    for name, kw, arg in (("elastic", {"mode": "drop"}, "mode"),
                          ("elasticflow", {"mode": "drop"}, "mode"),
                          ("elastic", {"costly_mode": "drop"}, "costly_mode"),
                          ("elastic", {"costly_mode": "drop", "opportunity_cost": None},
                           "costly_mode")):
        with pytest.raises(ValueError, match=f"^{arg} must be one of"):
            make_policy(name, **kw)


# -- wide starts (``widen_gain``) -------------------------------------------------------------
# RTX2080Ti at 2/n s a step, A100-40G at 1/n, 1 or 2 GPUs each; values 53.8 and 312 TFLOP/s,
# a launch 10 s. With 100 steps and deadline 400 s (380 s with the 5 % margin) the cheapest
# share is 1 RTX: 53.8 × 210 s ≈ 11,300 vs 2 RTX 53.8 × 2 × 110 ≈ 11,800 and 1 A100 312 × 110
# ≈ 34,300; its latest start, 380 − 210 = 170 s, is within the 600 s wake, so it is booked
# from now and the leftovers grow it to 2 RTX (110 s).
def _wide_setup(steps: int = 100, deadline: float = 400.0):
    rtx = [make_plan("RTX2080Ti", n, step_s=2.0 / n) for n in (1, 2)]
    a1 = [make_plan("A100-40G", n, step_s=1.0 / n) for n in (1, 2)]
    state = cluster(make_node("r0", "RTX2080Ti", 2), make_node("a0", "A100-40G", 2))
    return state, job("a", ranked(*rtx, *a1), deadline=deadline, steps=steps)


def test_a_job_started_while_nobody_waits_starts_wide_on_idle_faster_gpus() -> None:
    """Off (``widen_gain=None``, the rule before): 2 RTX, 110 s. With ``widen_gain`` 0.1 the
    idle A100s run it in 50 + 10 = 60 s ≤ 0.9 × 110 s, 1 A100 needs 110 s from now and fits
    beside every booking (there is no other), so it starts on 2 A100s; so it does with the
    default (0: any faster option)."""
    state, a = _wide_setup()
    (off,) = make_policy("elastic", perf=IdentityPerf(), widen_gain=None).decide(
        state, [a], [], 0.0)
    assert off.kind is DecisionKind.START
    assert (off.allocation.plan.gpu_type, off.allocation.num_gpus) == ("RTX2080Ti", 2)
    (on,) = make_policy("elastic", perf=IdentityPerf(), widen_gain=0.1).decide(
        state, [a], [], 0.0)
    assert on.kind is DecisionKind.START
    assert (on.allocation.plan.gpu_type, on.allocation.num_gpus) == ("A100-40G", 2)
    assert "started wide" in on.reason
    (dflt,) = make_policy("elastic", perf=IdentityPerf()).decide(state, [a], [], 0.0)
    assert dflt.allocation == on.allocation
    # 60 s is 45 % less than 110 s: a threshold of 0.5 keeps it where it was
    (hi,) = make_policy("elastic", perf=IdentityPerf(), widen_gain=0.5).decide(
        state, [a], [], 0.0)
    assert (hi.allocation.plan.gpu_type, hi.allocation.num_gpus) == ("RTX2080Ti", 2)


def test_no_wide_start_while_a_job_waits() -> None:
    """As above plus ``b`` (no deadline) whose only plan is 2 RTX: ``a`` holds 1 RTX from
    now, so ``b`` cannot start and waits; the A100s stay idle but ``a`` does not widen."""
    state, a = _wide_setup()
    b = job("b", [make_plan("RTX2080Ti", 2, step_s=1.0)], deadline=None, submit=1.0)
    out = make_policy("elastic", perf=IdentityPerf(), widen_gain=0.1).decide(
        state, [a, b], [], 0.0)
    got = {d.job_id: (d.allocation.plan.gpu_type, d.allocation.num_gpus) for d in out
           if d.kind is DecisionKind.START}
    assert got == {"a": ("RTX2080Ti", 2)}


@pytest.mark.parametrize(("other", "wide"), [
    (("A100-40G", 2, 500.0, 3000.0), False),  # 2 A100s promised from 500 s: neither fits
    (("A100-40G", 2, 1500.0, 3000.0), True),  # 2 A100s for 1,010 s end before 1,500 s
    (("A100-40G", 1, 500.0, 3000.0), True),   # 1 A100 for 2,010 s fits beside 1 promised
])
def test_a_wide_start_never_breaks_a_booking(other, wide) -> None:
    """``a``, 2,000 steps, deadline 10,000 s (9,500 s with the margin), booked 1 RTX
    [0, 4,010 s) and grown to 2 RTX; the A100s are idle now but another job holds a booking
    on them. On A100s ``a`` would need 2 for 1,010 s or 1 for 2,010 s from now (what it
    books at the next call): it widens only when one of these fits beside that booking."""
    state, a = _wide_setup(steps=2000, deadline=10_000.0)
    pol = make_policy("elastic", perf=IdentityPerf(), widen_gain=0.1)
    eng = pol.engine
    from scheduler.policies.deadline.candidates import Candidate

    opts = eng.options(a, state)
    c = Candidate(a, opts, None, None)
    own = Share(opts["RTX2080Ti"][0], 0, ticks_ceil(4010.0), 0.0)
    c.reserved, c.mandatory, c.target = own, True, opts["RTX2080Ti"][1]
    profile = Profile(0, state.total_by_type())
    profile.reserve("RTX2080Ti", 1, own.start, own.end)
    t, n, s, e = other
    profile.reserve(t, n, ticks_floor(s), ticks_floor(e))
    free = {"RTX2080Ti": 0, "A100-40G": 2}
    eng.leftovers.widen({"a": c}, free, profile, 0.0)
    assert (c.target.gpu_type, c.target.num_gpus) == (
        ("A100-40G", 2) if wide else ("RTX2080Ti", 2))
    assert free == ({"RTX2080Ti": 2, "A100-40G": 0} if wide else
                    {"RTX2080Ti": 0, "A100-40G": 2})
    # the profile is left as it was: own booking back, nothing else added
    assert profile.used_at("RTX2080Ti", 0) == 1
    assert profile.used_at("A100-40G", ticks_floor(s)) == n


def test_widen_gain_is_checked() -> None:
    with pytest.raises(ValueError, match="widen_gain"):
        make_policy("elastic", perf=IdentityPerf(), widen_gain=1.0)
