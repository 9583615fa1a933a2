"""The bucketed free-GPU index gives exactly the placements of a plain scan over every node
(the straightforward reading of Algorithm 1, written out below as the oracle), and the index a
state inherits from its parent through ``allocate``/``release`` equals one built from scratch."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from builders import GIB, cluster, make_job, make_node, make_plan

from scheduler.cluster import Allocation, ClusterState
from scheduler.placement import FreeGpus
from scheduler.policies.common import PlanIndex


def oracle(nodes: list[tuple[str, int, int]], num_gpus: int, min_memory: int, align: int,
           tightest: bool) -> tuple[tuple[str, int], ...] | None:
    """Algorithm 1 by scanning every node: ``nodes`` = (id, GPU memory, free) in cluster
    order, all of one GPU type."""
    idx = [k for k, (_, m, f) in enumerate(nodes) if f and m >= min_memory]
    if num_gpus <= 0 or sum(nodes[k][2] for k in idx) < num_gpus:
        return None
    for a in ((align, 1) if align > 1 and num_gpus % align == 0 else (1,)):
        pool = [(k, nodes[k][2] - nodes[k][2] % a) for k in idx]
        pool = [(k, u) for k, u in pool if u]
        if sum(u for _, u in pool) < num_gpus:
            continue
        out, remaining = [], num_gpus
        while True:
            fits = [(k, u) for k, u in pool if u >= remaining]
            if fits:
                k = (min(fits, key=lambda ku: (nodes[ku[0]][1], nodes[ku[0]][2], ku[0]))[0]
                     if tightest else fits[0][0])
                out.append((nodes[k][0], remaining))
                return tuple(out)
            j = max(range(len(pool)),
                    key=lambda j: (pool[j][1], -nodes[pool[j][0]][1], -pool[j][0]))
            k, u = pool.pop(j)
            out.append((nodes[k][0], u))
            remaining -= u
    return None


def random_cluster(rng: random.Random) -> ClusterState:
    nodes = []
    for i in range(rng.randint(1, 40)):
        gpu_type = rng.choice(["A", "B"])
        size = rng.choice([4, 8]) if gpu_type == "A" else 8
        memory = rng.choice([40, 80]) if gpu_type == "A" else 24  # type A mixes two tiers
        nodes.append(make_node(f"n{i}", gpu_type, size, rng.randint(0, size),
                               memory_gib=memory))
    return cluster(*nodes)


def scan(state: ClusterState, free: FreeGpus, gpu_type: str) -> list[tuple[str, int, int]]:
    return [(n.id, n.gpu_memory, free.free_on(n.id)) for n in state.nodes
            if n.gpu_type == gpu_type]


@pytest.mark.parametrize("seed", range(40))
def test_best_and_first_fit_match_the_full_scan(seed: int) -> None:
    rng = random.Random(seed)
    state = random_cluster(rng)
    free = FreeGpus.from_state(state)
    for _ in range(60):
        t = rng.choice(["A", "B"])
        n = rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 40])
        mem = rng.choice([0, 30, 60]) * GIB
        align = rng.choice([1, 2, 4, 8])
        nodes = scan(state, free, t)
        for tightest in (True, False):
            want = oracle(nodes, n, mem, align, tightest) if nodes else None
            got = (free.best_fit if tightest else free.first_fit)(t, n, mem, align)
            assert got == want, (nodes, n, mem, align, tightest)
        # change the free GPUs as a policy would: take a placement, or give some back
        if want is not None and rng.random() < 0.6:
            free.take(want)
        elif rng.random() < 0.5:
            back = [(i, rng.randint(1, 8)) for i, m, f in nodes]
            back = [(i, k) for i, k in back if free.free_on(i) + k <= state.by_id[i].total_gpus]
            if back:
                free.give(back[:3])
        assert free.free(t, mem) == sum(f for _, m, f in scan(state, free, t) if m >= mem)
        assert free.free_by_type == {
            ty: sum(f for _, _, f in scan(state, free, ty)) for ty in free.gpu_types()}


def test_index_follows_allocate_and_release() -> None:
    """A state made by ``allocate``/``release`` reuses its parent's index, updated: it must
    equal the index built from the nodes alone, and working copies must not leak into it."""
    rng = random.Random(7)
    state = random_cluster(rng)
    FreeGpus.from_state(state).take([(n.id, n.free_gpus) for n in state.nodes if n.free_gpus])
    # a working view's changes stay in it (copy on write)
    assert FreeGpus.from_state(state).total_free == state.free_gpus
    assert all(FreeGpus.from_state(state).free_on(n.id) == n.free_gpus for n in state.nodes)
    plan = make_plan("A", 1)
    held: list[Allocation] = []
    for step in range(80):
        if held and rng.random() < 0.4:
            state = state.release(held.pop(rng.randrange(len(held))))
        else:
            free_nodes = [n for n in state.nodes if n.free_gpus]
            if not free_nodes:
                continue
            node = rng.choice(free_nodes)
            alloc = Allocation(f"j{step}", plan, ((node.id, rng.randint(1, node.free_gpus)),))
            held.append(alloc)
            state = state.allocate(alloc)
        if rng.random() < 0.5:  # not every state is looked at
            continue
        derived = FreeGpus.from_state(state)
        fresh = FreeGpus.from_state(ClusterState(state.nodes, state.inter_node_bw_gbs))
        assert all(derived.free_on(n.id) == fresh.free_on(n.id) == n.free_gpus
                   for n in state.nodes)
        assert derived.free_by_type == fresh.free_by_type == state.free_by_type()
        assert derived.total_free == state.free_gpus
        for t in ("A", "B"):
            for n in (1, 3, 8, 20):
                assert derived.best_fit(t, n, 0, 2) == fresh.best_fit(t, n, 0, 2)


def test_allocation_counts_its_gpus_and_state_views_are_cached() -> None:
    state = cluster(make_node("a", "A", 8, 8, memory_gib=40), make_node("b", "A", 8, 3,
                                                                        memory_gib=40))
    alloc = Allocation("j", make_job("j", [make_plan("A", 6)]).plans[0], (("a", 4), ("b", 2)))
    assert alloc.num_gpus == 6
    assert state.by_id is state.by_id and state.by_id["b"].free_gpus == 3
    after = state.allocate(alloc)
    assert after.free_gpus == 5 and after.by_id["a"].free_gpus == 4
    assert after.release(alloc).free_gpus == 11 == state.free_gpus


def test_plan_index_speed_prefix_and_cheapest_order() -> None:
    # job times (step 1 s x 100 steps / GPUs-dependent step): 8xA 25 s, 4xA 50 s, 2xB 80 s,
    # 2xA 100 s; GPU-seconds 200, 200, 160, 200
    plans = (make_plan("A", 2, step_s=1.0), make_plan("A", 4, step_s=0.5),
             make_plan("A", 8, step_s=0.25), make_plan("B", 2, step_s=0.8))
    index = PlanIndex.build(plans, knee=0.0)  # every plan counts as efficient
    assert [p.job_time_s for p in index.efficient_by_speed] == [25.0, 50.0, 80.0, 100.0]
    assert index.faster_than(10.0) == 0
    assert index.faster_than(50.0) == 1  # strictly faster only
    assert index.faster_than(50.1) == 2
    assert index.faster_than(1e9) == 4
    assert dict(index.efficient_min_gpus[2]) == {"A": 4}
    assert dict(index.efficient_min_gpus[3]) == {"A": 4, "B": 2}
    assert dict(index.efficient_min_gpus[4]) == {"A": 2, "B": 2}
    # equal GPU-seconds keep the order of the plan list
    assert [p.num_gpus for p in index.cheapest("A")] == [2, 4, 8]
    assert index.cheapest("C") == ()
    # one type's plans, fastest first: A's 8 (25 s), 4 (50 s), 2 (100 s); B's only plan
    assert [p.num_gpus for p in index.fastest_of("A")] == [8, 4, 2]
    assert index.fastest_of("B") == (plans[3],)
    assert index.fastest_of("C") == ()
    # the same shapes with 4x the steps: every time scales, the positions carry over
    longer = tuple(replace(p, num_steps=400) for p in plans)
    again = index.restamp(longer)
    assert again.faster_than(200.1) == 2 and again.efficient_by_speed[0] is longer[2]
    assert again.cheapest("B") == (longer[3],)


def test_plan_index_undominated_plans() -> None:
    # GPU-seconds a step: 2xA 2.4, 4xA 2.0, 8xA 2.4, 16xA 3.2, 1xB 3.0, 2xB 3.0.
    # 2xA (1.2 s) is slower than 4xA (0.5 s) at more GPU-s: dominated. 8xA (0.3 s) and 16xA
    # (0.2 s) are faster than everything else of A: kept. 1xB (3.0 s) is slower than 2xB
    # (1.5 s) at equal GPU-s: dominated (no more GPU-seconds). A plan of another type never
    # dominates (B's 2xB at 1.5 s is no concern of A's).
    plans = (make_plan("A", 2, step_s=1.2), make_plan("A", 4, step_s=0.5),
             make_plan("A", 8, step_s=0.3), make_plan("A", 16, step_s=0.2),
             make_plan("B", 1, step_s=3.0), make_plan("B", 2, step_s=1.5))
    index = PlanIndex.build(plans)
    assert index.undominated() == (plans[1], plans[2], plans[3], plans[5])
    # the same shapes with another step count: the same positions (step times only)
    longer = tuple(replace(p, num_steps=700) for p in plans)
    assert index.restamp(longer).undominated() == (longer[1], longer[2], longer[3], longer[5])
    assert PlanIndex.build(longer).undominated() == (longer[1], longer[2], longer[3], longer[5])
