"""The Ray cluster the service runs on: an emulated heterogeneous one by default, or a real
one when ``RAY_ADDRESS`` is set.

``start_emulated`` reads a cluster YAML (the packaged ``frenzy-testbed`` by default) and
starts a real multi-node Ray cluster on this machine with ``ray.cluster_utils.Cluster``: one
raylet per YAML node, advertising the node's GPU count as Ray's ``GPU`` resource (emulated:
the training workers run on the CPU with gloo) and its type and name as the node labels the
``RayBackend`` reads (``frenzy.io/gpu-type``, ``frenzy.io/node-id``,
``frenzy.io/interconnect``). The first YAML node is the head. Each raylet gets one CPU and a
small object store so the paper's 5-node testbed fits a 2-core, 24 GiB machine; workers use
``num_cpus=0``. Ray's files go under a private temporary folder removed on ``shutdown``.

Crash safety. The emulated cluster lives and dies with the process that started it: its
GCS, raylets and monitors are Ray's direct children and get SIGKILL when that process dies
(Ray's kernel fate sharing), the workers exit when their raylet goes. What is left after a
SIGKILL is the temporary folder and each raylet's agents (dashboard and runtime-env agent),
which linger about a minute trying to report to the dead GCS. So the folder records its
owner (pid and start time) and every ``start_emulated`` first reaps the clusters of dead
owners (``reap_stale_clusters``): it kills the processes started for them (recognised by
the log files they hold open in the folder) and removes their folders.

``connect`` is what the service calls: ``RAY_ADDRESS`` set → ``ray.init(address=...)`` to
that cluster (its nodes started with ``ray start ... --labels=...``, see
``ray_start_command``); otherwise the emulated cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from orchestrator.clusters import ClusterSpec, load_cluster
from orchestrator.ray_backend import GPU_TYPE_LABEL, INTERCONNECT_LABEL, NODE_ID_LABEL
from scheduler.cluster import Node

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "frenzy-testbed"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
LEAN_NODE_ARGS: dict[str, Any] = {"include_log_monitor": False}
"""Every emulated node: no log monitor (it only streams worker logs to drivers, and the
service connects with ``log_to_driver=False``): one Python process fewer per node."""
LEAN_HEAD_ARGS: dict[str, Any] = {**LEAN_NODE_ARGS, "no_monitor": True}
"""The head also runs no autoscaler monitor: the emulated cluster never scales."""
TEMP_PREFIX = "frz-"
OWNER_FILE = "owner"
"""In an emulated cluster's temporary folder: ``<pid> <start time>`` of the process that
started it (the start time tells a reused pid apart)."""


def node_labels(node: Node) -> dict[str, str]:
    """The Ray labels that declare ``node`` to Frenzy."""
    return {GPU_TYPE_LABEL: node.gpu_type, NODE_ID_LABEL: node.id,
            INTERCONNECT_LABEL: node.interconnect}


def ray_start_command(node: Node, head_address: str = "<head-ip>:6379") -> str:
    """The ``ray start`` line that joins a real machine as ``node``."""
    labels = ",".join(f"{k}={v}" for k, v in node_labels(node).items())
    return (f"ray start --address={head_address} --num-gpus={node.total_gpus} "
            f'--labels="{labels}"')


@dataclass
class RayCluster:
    """A connected Ray cluster; ``emulated`` ones are started (and stopped) by us."""

    address: str
    emulated: bool
    spec: ClusterSpec | None = None
    temp_dir: Path | None = None
    startup_s: float = 0.0
    _cluster: Any = field(default=None, repr=False)

    def add_node(self, node: Node) -> Any:
        """Start one more emulated node (a machine joining)."""
        if self._cluster is None:
            raise RuntimeError("only an emulated cluster can add nodes")
        return self._cluster.add_node(num_cpus=1, num_gpus=node.total_gpus,
                                      labels=node_labels(node),
                                      object_store_memory=OBJECT_STORE_BYTES,
                                      **LEAN_NODE_ARGS)

    def remove_node(self, handle: Any) -> None:
        """Stop an emulated node (a machine leaving or crashing)."""
        self._cluster.remove_node(handle, allow_graceful=False)

    def node_handle(self, node_id: str) -> Any:
        """The ``cluster_utils`` handle of the emulated node named ``node_id``."""
        for handle in self._cluster.list_all_nodes():
            if handle.node_id and _label_of(handle.node_id) == node_id:
                return handle
        raise KeyError(node_id)

    def shutdown(self) -> None:
        """Disconnect; stop and clean up the cluster if we started it."""
        if ray.is_initialized():
            ray.shutdown()
        if self._cluster is not None:
            self._cluster.shutdown()
            self._cluster = None
        if self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> RayCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _label_of(ray_node_id: str) -> str | None:
    for n in ray.nodes():
        if n.get("NodeID") == ray_node_id:
            return (n.get("Labels") or {}).get(NODE_ID_LABEL)
    return None


def start_emulated(cluster: str | Path = DEFAULT_CLUSTER, *,
                   namespace: str = "frenzy") -> RayCluster:
    """Start a local multi-node Ray cluster emulating ``cluster`` (YAML name or path) and
    connect to it."""
    from ray.cluster_utils import Cluster

    spec = load_cluster(cluster)
    nodes = list(spec.state.nodes)
    t0 = time.monotonic()
    reap_stale_clusters()
    base = Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))  # short: Ray's socket paths have a limit
    _write_owner(base)
    (base / "ray").mkdir()
    os.environ["RAY_TMPDIR"] = str(base)  # where cluster_utils writes its address file
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    head, *rest = nodes
    c = Cluster(initialize_head=True, head_node_args=dict(
        num_cpus=1, num_gpus=head.total_gpus, labels=node_labels(head),
        include_dashboard=False, object_store_memory=OBJECT_STORE_BYTES,
        temp_dir=str(base / "ray"), **LEAN_HEAD_ARGS))
    for node in rest:
        c.add_node(num_cpus=1, num_gpus=node.total_gpus, labels=node_labels(node),
                   object_store_memory=OBJECT_STORE_BYTES, **LEAN_NODE_ARGS)
    ray.init(address=c.address, namespace=namespace, log_to_driver=False)
    c.wait_for_nodes()
    out = RayCluster(address=c.address, emulated=True, spec=spec, temp_dir=base,
                     startup_s=time.monotonic() - t0, _cluster=c)
    log.info("emulated cluster %s up in %.1f s at %s (files in %s): %s", spec.name,
             out.startup_s, c.address, base,
             ", ".join(f"{n.id}={n.total_gpus}x{n.gpu_type}" for n in nodes))
    return out


# -- crash safety: clusters whose owner died -------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), None if it is gone.
    Linux only; elsewhere "unknown" for a live pid (no reuse check)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return "unknown"
    # the command name (field 2) may hold spaces and parentheses: split after the last ')'
    return stat[stat.rindex(")") + 2:].split()[19]


def _write_owner(base: Path) -> None:
    (base / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or 'unknown'}\n")


def _owner_dead(base: Path) -> bool:
    """True when ``base`` records an owner and that process is gone (a folder without an
    owner file is someone else's, or being set up: never reaped)."""
    try:
        pid_s, started = (base / OWNER_FILE).read_text().split()
    except (OSError, ValueError):
        return False
    now = _start_time(int(pid_s))
    return now is None or (started != "unknown" and now != "unknown" and now != started)


def cluster_processes(base: Path) -> list[int]:
    """Pids of the live processes started for the emulated cluster in ``base`` (Linux: read
    from ``/proc``; elsewhere nothing is found). Ray's GCS, raylets, agents and workers all
    have a file open under ``base`` (their logs) or, until ``setproctitle`` overwrites it,
    ``RAY_TMPDIR=<base>`` in their environment, inherited from the process that started it."""
    marker = f"RAY_TMPDIR={base}".encode()
    prefix = f"{base}{os.sep}"
    pids: list[int] = []
    proc = Path("/proc")
    if not proc.is_dir():
        return pids
    for entry in proc.iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0") or any(
                    os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir()):
                pids.append(int(entry.name))
        except OSError:  # gone, or not ours
            continue
    return sorted(pids)


def reap_stale_clusters(root: str | Path | None = None, *, timeout_s: float = 5.0) -> int:
    """Kill what is left of emulated clusters whose owner died (a SIGKILLed service) and
    remove their folders; clusters of live owners are not touched. Returns the number of
    processes killed."""
    killed: set[int] = set()
    for base in sorted(Path(root or tempfile.gettempdir()).glob(f"{TEMP_PREFIX}*")):
        if not base.is_dir() or not _owner_dead(base):
            continue
        deadline = time.monotonic() + timeout_s
        while (pids := cluster_processes(base)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    killed.add(pid)
            time.sleep(0.05)
        if pids:
            log.warning("could not reap processes %s of the dead cluster in %s", pids, base)
        shutil.rmtree(base, ignore_errors=True)
        log.info("reaped the emulated cluster left in %s by a dead owner", base)
    return len(killed)


def connect(cluster: str | Path = DEFAULT_CLUSTER, *, namespace: str = "frenzy") -> RayCluster:
    """``RAY_ADDRESS`` set: join that cluster (production). Else: start the emulated one."""
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, namespace=namespace)
        log.info("connected to Ray cluster at %s", address)
        return RayCluster(address=address, emulated=False)
    return start_emulated(cluster, namespace=namespace)
