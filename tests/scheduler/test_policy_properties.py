"""Invariants every policy keeps, on random clusters and queues (hypothesis): capacity never
exceeded, no GPU given twice, every allocation's plan fits its GPUs (type and memory), at most
one decision per job, and the same inputs give the same decisions."""

from __future__ import annotations

from dataclasses import dataclass

from builders import (
    IdentityPerf,
    NodesPenaltyPerf,
    apply_decisions,
    assert_allocation_valid,
    assert_reason_codes,
    make_job,
    make_node,
    make_plan,
    ranked,
    summary,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.cluster import ClusterState
from scheduler.decision import DecisionKind
from scheduler.job import JobView, RunningJob
from scheduler.policy import make_policy

# (type, GiB per GPU, GPUs per node)
TYPES = [("A100-40G", 40, 8), ("RTX2080Ti", 11, 8), ("RTX6000", 24, 4), ("A100-80G", 80, 8)]
POLICIES = ["has", "opportunistic", "sia"]


@dataclass
class Scenario:
    state: ClusterState
    pending: list[JobView]
    running: list[RunningJob]


@st.composite
def plans_st(draw):
    n = draw(st.integers(1, 6))
    out = []
    for _ in range(n):
        t, gib, _ = draw(st.sampled_from(TYPES))
        tp = draw(st.sampled_from([1, 1, 2, 4]))
        gpus = tp * draw(st.sampled_from([1, 2, 3, 4]))
        req = draw(st.floats(0.3, 1.1)) * gib  # some plans fit no GPU of their type
        step = draw(st.floats(0.1, 10.0))
        out.append(make_plan(t, gpus, tp=tp, req_gib=req, step_s=step))
    return ranked(*out)


@st.composite
def scenario_st(draw):
    nodes = []
    for i in range(draw(st.integers(1, 6))):
        t, gib, per = draw(st.sampled_from(TYPES))
        free = draw(st.integers(0, per))
        nodes.append(make_node(f"n{i}", t, per, free, memory_gib=gib))
    state = ClusterState(nodes=tuple(nodes))
    pending = [
        make_job(f"p{i}", draw(plans_st()), submit=float(i),
                 requested=draw(st.one_of(st.none(), st.sampled_from([1, 2, 4, 8]))))
        for i in range(draw(st.integers(0, 8)))
    ]
    # running jobs: start some jobs with HAS on the free GPUs, so their allocations are real
    seeds = [make_job(f"r{i}", draw(plans_st()), submit=-100.0 - i)
             for i in range(draw(st.integers(0, 4)))]
    started = make_policy("has", perf=IdentityPerf()).decide(state, seeds, [], -50.0)
    by_id = {j.id: j for j in seeds}
    running = []
    for d in started:
        assert d.allocation is not None
        state = state.allocate(d.allocation)
        running.append(RunningJob(by_id[d.job_id], d.allocation, draw(st.sampled_from(
            [-50.0, -5.0]))))
    return Scenario(state, pending, running)


def _check(name: str, sc: Scenario, now: float) -> None:
    policy = make_policy(name, perf=IdentityPerf())
    decisions = policy.decide(sc.state, sc.pending, sc.running, now)
    ids = [d.job_id for d in decisions]
    assert len(ids) == len(set(ids)) or name == "sia", f"two decisions for one job: {ids}"
    pending_ids = {j.id for j in sc.pending}
    running_ids = {r.job.id for r in sc.running}
    assert_reason_codes(decisions, sc.running)
    for d in decisions:
        assert d.reason
        if d.kind is DecisionKind.START:
            assert d.job_id in pending_ids
        else:
            assert d.job_id in running_ids
    # apply one by one: CapacityError on any GPU given twice or beyond a node's capacity
    applied = apply_decisions(sc.state, sc.running, decisions)
    for node in applied.state.nodes:
        assert 0 <= node.free_gpus <= node.total_gpus
    for d in decisions:
        if d.allocation is not None:
            assert_allocation_valid(sc.state, d.allocation)
    # GPUs in use changed by exactly what the jobs' holdings changed (nothing leaked)
    held_before = sum(r.allocation.num_gpus for r in sc.running)
    held_after = sum(a.num_gpus for a in applied.holding.values())
    assert sc.state.free_gpus - applied.state.free_gpus == held_after - held_before
    # determinism: a fresh policy on the same inputs decides the same
    again = make_policy(name, perf=IdentityPerf()).decide(sc.state, sc.pending, sc.running, now)
    assert summary(again) == summary(decisions)


_SETTINGS = settings(max_examples=60, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow])


@_SETTINGS
@given(scenario_st())
def test_has_invariants(sc: Scenario) -> None:
    _check("has", sc, 0.0)


@_SETTINGS
@given(scenario_st())
def test_opportunistic_invariants(sc: Scenario) -> None:
    _check("opportunistic", sc, 0.0)


@_SETTINGS
@given(scenario_st())
def test_sia_invariants(sc: Scenario) -> None:
    _check("sia", sc, 0.0)


@settings(max_examples=30, deadline=None)
@given(scenario_st())
def test_sia_split_resizes_still_apply_in_order(sc: Scenario) -> None:
    # a second, later round: running jobs may be resized or stopped; the decision list must
    # apply one at a time (order_for_sequential_apply), and no job gets both a start and a
    # resize
    policy = make_policy("sia", perf=NodesPenaltyPerf())
    policy.decide(sc.state, [], sc.running, 0.0)
    decisions = policy.decide(sc.state, sc.pending, sc.running, 600.0)
    apply_decisions(sc.state, sc.running, decisions)
    starts = {d.job_id for d in decisions if d.kind is DecisionKind.START}
    resizes = {d.job_id for d in decisions if d.kind is DecisionKind.RESIZE}
    assert not starts & resizes
