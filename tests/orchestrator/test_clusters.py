"""Cluster YAML files → ClusterState: packaged names, file paths, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.clusters import ClusterConfigError, load_cluster, packaged_clusters

PACKAGED = ["frenzy-testbed", "hetero-128", "phoebe", "scaled-2048", "scaled-256", "sia-64"]


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


def test_packaged_names_and_legacy_config_paths() -> None:
    assert packaged_clusters() == PACKAGED
    for spelling in ("phoebe", "phoebe.yaml", "config/phoebe.yaml",
                     "/old/checkout/config/phoebe.yaml"):
        spec = load_cluster(spelling)
        assert spec.name == "phoebe" and spec.total_gpus == 44  # 3×8 + 2×8 + 1×4
        assert spec.path.parent.parts[-3:] == ("orchestrator", "data", "clusters")


def test_a_file_path_wins_over_the_packaged_name(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "phoebe.yaml").write_text("name: mine\nnodes:\n  - {id: a, gpu_type: T4, count: 2}")
    (tmp_path / "more.yaml").write_text("include: phoebe.yaml\nscale: 3\n")
    monkeypatch.chdir(tmp_path)
    assert load_cluster("phoebe.yaml").name == "mine"
    assert load_cluster("phoebe.yaml").total_gpus == 2
    assert load_cluster(tmp_path / "more.yaml").total_gpus == 6  # include beside the file
    assert load_cluster("phoebe").total_gpus == 44  # a bare name: the packaged one


@pytest.mark.parametrize("given", ["nope", "config/nope.yaml", "elsewhere/phoebe.yaml"])
def test_unknown_cluster_lists_the_packaged_names(given: str) -> None:
    with pytest.raises(ClusterConfigError) as exc:
        load_cluster(given)
    msg = str(exc.value)
    assert repr(given) in msg and "no such file" in msg
    assert msg.endswith(", ".join(PACKAGED))
