"""HAS on a 2,048-GPU cluster: every decision round is valid (none dropped by the fail-safe).

The replay that found it: on sia-64 x 32, SRPT growth moved a running job onto another GPU
type (its old GPUs back in the free pool, one taken by a start) and, in the same call,
undoing growth for a waiting job shrank the same job on its old placement, a second
decision for it that granted GPUs twice (the controller dropped the round: CapacityError).
"""

from __future__ import annotations

import pytest

from orchestrator.clusters import load_cluster
from scheduler.policy import make_policy
from simulator.replay import PlanCache, SimConfig, job_view, load_workloads, replay


@pytest.mark.parametrize("minimal_undo", [True, False])
def test_no_round_dropped_at_2048_gpus(minimal_undo: bool) -> None:
    cluster = load_cluster("sia-64", scale=32).state
    cache = PlanCache(cluster)
    views = [job_view(m, cache) for m in load_workloads("sia-scale_32x:1")[0][1]]
    policy = make_policy("has", minimal_undo=minimal_undo)
    decide = policy.decide
    calls = 0

    def one_decision_per_job(state, pending, running, now):  # type: ignore[no-untyped-def]
        nonlocal calls
        out = decide(state, pending, running, now)
        ids = [d.job_id for d in out]
        assert len(ids) == len(set(ids)), f"t={now}: two decisions for one job: {ids}"
        calls += 1
        return out

    policy.decide = one_decision_per_job  # type: ignore[method-assign]
    res = replay(views, cluster, policy, config=SimConfig(until_s=4_400))
    assert calls > 100
    assert res.controller.policy_failures == 0
