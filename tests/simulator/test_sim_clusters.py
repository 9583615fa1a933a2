"""Cluster YAML files → ClusterState, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.clusters import ClusterConfigError, load_cluster


def test_shipped_clusters() -> None:
    ph = load_cluster("config/phoebe.yaml")
    assert ph.state.total_by_type() == {"RTX2080Ti": 24, "A100-40G": 16, "RTX6000": 4}
    assert len(ph.state.nodes) == 6 and ph.state.node("dgx-1").interconnect == "nvlink"
    assert load_cluster("sia-64").total_gpus == 64
    tb = load_cluster("frenzy-testbed").state
    assert tb.total_by_type() == {"A100-40G": 3, "A800-80G": 4, "A100-80G": 4}
    assert len(tb.nodes) == 5
    big = load_cluster("scaled-2048")
    assert big.total_gpus == 2048 and big.scale == 32
    assert load_cluster("phoebe", scale=3).total_gpus == 132


@pytest.mark.parametrize("body,message", [
    ("nodes: []", "nodes: expected a non-empty list"),
    ("nodes:\n  - {id: a, gpu_type: H9000, count: 8}", r"nodes\[0\].gpu_type: unknown GPU type"),
    ("nodes:\n  - {id: a, gpu_type: T4, count: 0}", r"nodes\[0\].count: expected a positive"),
    ("nodes:\n  - {id: a, gpu_type: T4}", r"nodes\[0\]: missing 'count'"),
    ("nodes:\n  - {id: a, gpu_type: T4, count: 4, link: x}", "unknown field"),
    ("nodes:\n  - {id: a, gpu_type: T4, count: 4, interconnect: ib}", "nvlink or pcie"),
    ("nodes:\n  - {id: a, gpu_type: T4, count: 4}\n  - {id: a, gpu_type: T4, count: 4}",
     "duplicate node ids"),
    ("scale: 0\nnodes:\n  - {id: a, gpu_type: T4, count: 4}", "scale: expected a positive"),
    ("[1, 2", "not valid YAML"),
])
def test_errors_name_file_and_field(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(body)
    with pytest.raises(ClusterConfigError, match=message):
        load_cluster(p)


def test_unknown_cluster_name_lists_known() -> None:
    with pytest.raises(ClusterConfigError, match=r"known clusters: .*phoebe"):
        load_cluster("nope")
