"""Cluster descriptions (YAML) → ``ClusterState``.

A cluster is named by a file path or by the name of one shipped with the package
(``orchestrator/data/clusters/<name>.yaml``, read with ``importlib.resources`` so an installed
wheel has them): ``phoebe``, ``frenzy-testbed``, ``sia-64`` ... A path of the
``config/<name>.yaml`` form, where these files lived before they were packaged, that does not
exist resolves to the packaged cluster of that name, so older command lines keep working.

Format::

    name: phoebe
    inter_node_bw_gbs: 12.5          # optional, GB/s between nodes
    scale: 1                         # optional: every node group replicated N times
    include: other.yaml              # optional: take nodes (and bandwidth) from another file
    nodes:
      - {id: rtx, gpu_type: RTX2080Ti, count: 8, interconnect: pcie, replicas: 3}
      - {id: tiny, gpu_type: T4, count: 2, gpu_memory_gib: 1.5}   # emulated small GPUs

``gpu_type`` must name an entry of the GPU catalog (``predictor.gpus``); ``gpu_memory_gib``
(optional) gives the memory per GPU when it is not the catalog's (a MIG slice, or an
emulated GPU of tiny capacity: the CPU trainer enforces it as its memory cap); a group with
``replicas: n`` (times ``scale``) becomes nodes ``<id>-0 .. <id>-(n·scale-1)``. Every mistake
is reported with the file, the node's index and the field.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import yaml

from predictor.gpus import load_gpu_catalog
from scheduler.cluster import ClusterState, Node

log = logging.getLogger(__name__)

PACKAGED_DIR: Traversable = resources.files("orchestrator") / "data" / "clusters"
"""The clusters shipped with the package, one ``<name>.yaml`` each."""
_NODE_FIELDS = {"id", "gpu_type", "count", "interconnect", "replicas", "intra_bw_gbs",
                "gpu_memory_gib"}


class ClusterConfigError(ValueError):
    """A cluster file that cannot be read: which file, which entry, what was expected."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """A loaded cluster description."""

    name: str
    path: Path
    state: ClusterState
    scale: int = 1

    @property
    def total_gpus(self) -> int:
        return self.state.total_gpus


def packaged_clusters() -> list[str]:
    """The names of the clusters shipped with the package, sorted."""
    return sorted(f.name.removesuffix(".yaml") for f in PACKAGED_DIR.iterdir()
                  if f.name.endswith(".yaml"))


def resolve_cluster_path(name_or_path: str | Path) -> Path:
    """A file path as given, or the packaged cluster a bare name such as ``phoebe`` (or
    ``phoebe.yaml``, or a missing ``config/phoebe.yaml``) stands for."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    legacy = p.suffix == ".yaml" and p.parent.name in ("", "config")
    name = p.stem if legacy else str(name_or_path)
    cand = PACKAGED_DIR / f"{name}.yaml"
    if "/" not in name and cand.is_file():
        if p.parent.name == "config":
            log.info("%s: no such file; using the packaged cluster %r", name_or_path, name)
        return Path(str(cand))
    raise ClusterConfigError(
        f"cluster {str(name_or_path)!r}: no such file and no packaged cluster of that name; "
        f"give a cluster YAML file or one of: {', '.join(packaged_clusters())}"
    )


def load_cluster(name_or_path: str | Path, *, scale: int | None = None) -> ClusterSpec:
    """Read a cluster file; ``scale`` overrides the file's own ``scale``."""
    path = resolve_cluster_path(name_or_path)
    raw = _read(path)
    return _build(path, raw, scale, depth=0)


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ClusterConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ClusterConfigError(f"{path}: expected a mapping with a 'nodes' list at top level")
    return raw


def _build(path: Path, raw: dict[str, Any], scale: int | None, depth: int) -> ClusterSpec:
    if depth > 4:
        raise ClusterConfigError(f"{path}: 'include' nested too deeply (a cycle?)")
    file_scale = raw.get("scale", 1)
    if isinstance(file_scale, bool) or not isinstance(file_scale, int) or file_scale < 1:
        raise ClusterConfigError(f"{path}: scale: expected a positive integer, got {file_scale!r}")
    factor = scale if scale is not None else file_scale
    if isinstance(factor, bool) or not isinstance(factor, int) or factor < 1:
        raise ClusterConfigError(f"{path}: scale: expected a positive integer, got {factor!r}")
    name = str(raw.get("name", path.stem))
    if "include" in raw:
        inc = path.parent / str(raw["include"])
        if not inc.exists():
            raise ClusterConfigError(f"{path}: include: no such file {inc}")
        base = _read(inc)
        merged = {**base, **{k: v for k, v in raw.items() if k not in ("include", "scale")}}
        merged.setdefault("nodes", base.get("nodes"))
        merged["scale"] = 1
        spec = _build(inc, merged, factor, depth + 1)
        return ClusterSpec(name=name, path=path, state=spec.state, scale=factor)
    nodes_raw = raw.get("nodes")
    if not isinstance(nodes_raw, list) or not nodes_raw:
        raise ClusterConfigError(f"{path}: nodes: expected a non-empty list of node groups")
    bw = raw.get("inter_node_bw_gbs", 12.5)
    if isinstance(bw, bool) or not isinstance(bw, int | float) or bw <= 0:
        raise ClusterConfigError(f"{path}: inter_node_bw_gbs: expected a positive number, "
                                 f"got {bw!r}")
    catalog = load_gpu_catalog()
    nodes: list[Node] = []
    for i, entry in enumerate(nodes_raw):
        nodes.extend(_group(path, i, entry, factor, catalog))
    try:
        state = ClusterState(nodes=tuple(nodes), inter_node_bw_gbs=float(bw))
    except ValueError as e:
        raise ClusterConfigError(f"{path}: {e}") from None
    return ClusterSpec(name=name, path=path, state=state, scale=factor)


def _group(path: Path, i: int, entry: Any, factor: int, catalog: dict[str, Any]) -> list[Node]:
    where = f"{path}: nodes[{i}]"
    if not isinstance(entry, dict):
        raise ClusterConfigError(f"{where}: expected a mapping with id, gpu_type, count")
    unknown = sorted(set(entry) - _NODE_FIELDS)
    if unknown:
        raise ClusterConfigError(f"{where}: unknown field(s) {', '.join(unknown)}; "
                                 f"allowed: {', '.join(sorted(_NODE_FIELDS))}")
    for key in ("id", "gpu_type", "count"):
        if key not in entry:
            raise ClusterConfigError(f"{where}: missing '{key}'")
    gpu_type = str(entry["gpu_type"])
    if gpu_type not in catalog:
        raise ClusterConfigError(f"{where}.gpu_type: unknown GPU type {gpu_type!r}; known: "
                                 f"{', '.join(sorted(catalog))}")
    count = entry["count"]
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ClusterConfigError(f"{where}.count: expected a positive integer, got {count!r}")
    replicas = entry.get("replicas", 1)
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise ClusterConfigError(f"{where}.replicas: expected a positive integer, "
                                 f"got {replicas!r}")
    link = entry.get("interconnect", catalog[gpu_type].link)
    if link not in ("nvlink", "pcie"):
        raise ClusterConfigError(f"{where}.interconnect: expected nvlink or pcie, got {link!r}")
    intra = entry.get("intra_bw_gbs")
    if intra is not None and (isinstance(intra, bool) or not isinstance(intra, int | float)
                              or intra <= 0):
        raise ClusterConfigError(f"{where}.intra_bw_gbs: expected a positive number, "
                                 f"got {intra!r}")
    n = replicas * factor
    base = str(entry["id"])
    ids = [base] if n == 1 else [f"{base}-{k}" for k in range(n)]
    mem = catalog[gpu_type].memory_bytes
    gib = entry.get("gpu_memory_gib")
    if gib is not None:
        if isinstance(gib, bool) or not isinstance(gib, int | float) or gib <= 0:
            raise ClusterConfigError(f"{where}.gpu_memory_gib: expected a positive number, "
                                     f"got {gib!r}")
        mem = int(gib * (1 << 30))
    return [
        Node(id=node_id, gpu_type=gpu_type, gpu_memory=mem, total_gpus=count, free_gpus=count,
             interconnect=link, intra_bw_gbs=float(intra) if intra is not None else None)
        for node_id in ids
    ]
