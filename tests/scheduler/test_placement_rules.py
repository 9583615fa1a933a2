"""FreeGpus and Frenzy's Algorithm 1 placement, with the paper's own examples (§IV-B)."""

from __future__ import annotations

import pytest
from builders import cluster, make_node

from scheduler.placement import FreeGpus

GB = 1 << 30


def test_paper_job_2x32_goes_to_node_3x40_not_6x80() -> None:
    # Job(2, 32GB); Node(3, 40GB) and Node(6, 80GB) of one GPU family
    state = cluster(make_node("big", "A100", 8, 6, memory_gib=80),
                    make_node("small", "A100", 8, 3, memory_gib=40))
    free = FreeGpus.from_state(state)
    assert free.best_fit("A100", 2, 32 * GB) == (("small", 2),)


def test_tighter_memory_tier_wins_over_fewer_free_gpus() -> None:
    # Algorithm 1 line 14: fitSz = the smallest adequate GPU size; only nodes of that size are
    # considered while they have GPUs (a 40 GB GPU is not spent where 80 GB ones would be).
    state = cluster(make_node("big", "A100", 8, 2, memory_gib=80),
                    make_node("small", "A100", 8, 6, memory_gib=40))
    free = FreeGpus.from_state(state)
    assert free.best_fit("A100", 2, 32 * GB) == (("small", 2),)
    assert free.best_fit("A100", 2, 48 * GB) == (("big", 2),)


def test_paper_job_4x35_goes_to_one_node_4x40_not_four_1x40() -> None:
    nodes = [make_node(f"one-{i}", "A100-40G", 8, 1) for i in range(4)]
    nodes.append(make_node("four", "A100-40G", 8, 4))
    free = FreeGpus.from_state(cluster(*nodes))
    assert free.best_fit("A100-40G", 4, 35 * GB) == (("four", 4),)


def test_best_fit_prefers_exact_then_tightest_node() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 5), make_node("b", "A100-40G", 8, 4),
                    make_node("c", "A100-40G", 8, 6))
    free = FreeGpus.from_state(state)
    assert free.best_fit("A100-40G", 4) == (("b", 4),)  # exact
    assert free.best_fit("A100-40G", 3) == (("b", 3),)  # tightest: 4 free beats 5 and 6
    assert free.best_fit("A100-40G", 6) == (("c", 6),)
    assert free.best_fit("A100-40G", 16) is None  # only 15 free


def test_greedy_takes_most_free_node_then_best_fits_the_rest() -> None:
    # 8 GPUs; no node holds 8: take the 6-free node, then the remaining 2 go to the
    # tightest node that holds 2 (3 free), not the 1-free one
    state = cluster(make_node("a", "A100-40G", 8, 1), make_node("b", "A100-40G", 8, 6),
                    make_node("c", "A100-40G", 8, 3))
    free = FreeGpus.from_state(state)
    assert free.best_fit("A100-40G", 8) == (("b", 6), ("c", 2))


def test_greedy_over_three_nodes_uses_fewest() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 3), make_node("b", "A100-40G", 8, 2),
                    make_node("c", "A100-40G", 8, 2), make_node("d", "A100-40G", 8, 1))
    free = FreeGpus.from_state(state)
    # 3 from a, then 4 left: no node has 4: take b (2, first of the ties), then 2 fit c
    assert free.best_fit("A100-40G", 7) == (("a", 3), ("b", 2), ("c", 2))


def test_tensor_parallel_groups_stay_inside_nodes_when_possible() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 3), make_node("b", "A100-40G", 8, 3))
    free = FreeGpus.from_state(state)
    # tp=2: take 2+2 (each tp pair inside a node) rather than 3+1
    assert free.best_fit("A100-40G", 4, align=2) == (("a", 2), ("b", 2))
    assert free.best_fit("A100-40G", 4) == (("a", 3), ("b", 1))
    # tp=4 cannot be kept inside a node here: fall back to any split
    assert free.best_fit("A100-40G", 4, align=4) == (("a", 3), ("b", 1))


def test_first_fit_takes_first_node_in_cluster_order() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 6), make_node("b", "A100-40G", 8, 2))
    free = FreeGpus.from_state(state)
    assert free.first_fit("A100-40G", 2) == (("a", 2),)
    assert free.best_fit("A100-40G", 2) == (("b", 2),)


def test_types_do_not_mix_and_memory_is_respected() -> None:
    state = cluster(make_node("r", "RTX2080Ti", 8, 8), make_node("q", "RTX6000", 4, 4))
    free = FreeGpus.from_state(state)
    assert free.best_fit("RTX6000", 8) is None
    assert free.best_fit("RTX2080Ti", 2, 12 * GB) is None  # 11 GB cards
    assert free.best_fit("A100-40G", 1) is None
    assert free.free("RTX2080Ti", 12 * GB) == 0
    assert free.free("RTX6000", 12 * GB) == 4


def test_take_and_give_update_counts_and_refuse_too_much() -> None:
    state = cluster(make_node("a", "A100-40G", 8, 4), make_node("b", "T4", 4, 4))
    free = FreeGpus.from_state(state)
    free.take((("a", 3),))
    assert free.free("A100-40G") == 1 and free.total_free == 5
    with pytest.raises(ValueError):
        free.take((("a", 2),))
    free.give((("a", 3),))
    assert free.free_on("a") == 4
    with pytest.raises(ValueError):
        free.give((("a", 5),))


def test_packed_shape_fills_largest_nodes_first() -> None:
    state = cluster(make_node("a", "A100-40G", 4, 0), make_node("b", "A100-40G", 8, 0))
    free = FreeGpus.from_state(state)
    assert free.packed("A100-40G", 2) == (("b", 2),)
    assert free.packed("A100-40G", 12) == (("b", 8), ("a", 4))
    assert free.packed("A100-40G", 13) is None
