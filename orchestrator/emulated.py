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

Closed by default. The emulated cluster's GCS, raylets, agents and workers bind to
127.0.0.1 only (``node_ip_address``; Ray is also told it is a single-machine cluster, so the
driver does not rewrite 127.0.0.1 to the machine's address), and Ray's token auth is on
(``RAY_AUTH_MODE=token``): the token is generated at the first start into a ``0600`` file
(``ray_auth_token_file``: ``$RAY_AUTH_TOKEN_PATH``, else ``$FRENZY_RAY_TOKEN_FILE``, else
``~/.config/frenzy/ray-auth-token``) and reused after; every node and worker reads it through
``RAY_AUTH_TOKEN_PATH``. A client without it is refused. Another driver on this machine
joins with ``client_env()`` in its environment. User code never sees it (its environment is
rebuilt from scratch and it runs under another uid: ``orchestrator.sandbox``).

``connect`` is what the service calls: ``RAY_ADDRESS`` set → ``ray.init(address=...)`` to
that cluster (its nodes started with ``ray start ... --labels=...``, see
``ray_start_command``); otherwise the emulated cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray

from orchestrator.clusters import ClusterSpec, load_cluster
from orchestrator.ray_backend import (
    GPU_MEMORY_LABEL,
    GPU_TYPE_LABEL,
    INTERCONNECT_LABEL,
    NODE_ID_LABEL,
)
from predictor.gpus import get_gpu
from scheduler.cluster import Node

log = logging.getLogger(__name__)

DEFAULT_CLUSTER = "frenzy-testbed"
OBJECT_STORE_BYTES = 80 * 1024 * 1024
LOOPBACK = "127.0.0.1"
LEAN_NODE_ARGS: dict[str, Any] = {"include_log_monitor": False, "node_ip_address": LOOPBACK}
"""Every emulated node: no log monitor (it only streams worker logs to drivers, and the
service connects with ``log_to_driver=False``): one Python process fewer per node; every
port on the loopback address only."""
LEAN_HEAD_ARGS: dict[str, Any] = {**LEAN_NODE_ARGS, "no_monitor": True}
"""The head also runs no autoscaler monitor: the emulated cluster never scales."""
TEMP_PREFIX = "frz-"
OWNER_FILE = "owner"
"""In an emulated cluster's temporary folder: ``<pid> <start time>`` of the process that
started it (the start time tells a reused pid apart)."""


def node_labels(node: Node) -> dict[str, str]:
    """The Ray labels that declare ``node`` to Frenzy (its GPU memory only when it is not
    the catalog's figure for its type)."""
    labels = {GPU_TYPE_LABEL: node.gpu_type, NODE_ID_LABEL: node.id,
              INTERCONNECT_LABEL: node.interconnect}
    if node.gpu_memory != get_gpu(node.gpu_type).memory_bytes:
        labels[GPU_MEMORY_LABEL] = str(node.gpu_memory)
    return labels


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
    _close_control_plane()
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


# -- closed control plane: loopback and token auth -------------------------------------------
SINGLE_MACHINE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
"""Ray's switch for "this cluster is one machine" (``ray_constants.ENABLE_RAY_CLUSTER``): off,
a driver connects to 127.0.0.1 as given instead of the machine's outward address."""


def ray_auth_token_file() -> Path:
    """Where the emulated cluster's Ray auth token lives (see the module docstring)."""
    for var in ("RAY_AUTH_TOKEN_PATH", "FRENZY_RAY_TOKEN_FILE"):
        if os.environ.get(var):
            return Path(os.environ[var])
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return base / "frenzy" / "ray-auth-token"


def ensure_ray_auth_token(path: Path) -> Path:
    """Create ``path`` with a new random token unless it exists (mode 0600 from the start:
    written under a temporary name opened 0600, then renamed); tighten an existing file's
    mode if others could read it."""
    if path.exists():
        if path.stat().st_mode & 0o077:
            log.warning("Ray auth token file %s was readable by others: now 0600", path)
            os.chmod(path, 0o600)
        if not path.read_text().strip():
            raise ValueError(f"Ray auth token file {path} is empty: delete it or put a token "
                             "in it")
        return path
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    log.info("generated the Ray auth token of the emulated cluster in %s (mode 0600)", path)
    return path


def client_env() -> dict[str, str]:
    """Environment for another driver process on this machine to join the emulated cluster
    (auth mode, the token file, single-machine addressing)."""
    env = {"RAY_AUTH_MODE": "token", SINGLE_MACHINE_ENV: "0"}
    if not os.environ.get("RAY_AUTH_TOKEN"):
        env["RAY_AUTH_TOKEN_PATH"] = str(ray_auth_token_file())
    return env


def _close_control_plane() -> None:
    """Token auth on and loopback addressing for this process and everything it starts."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        log.warning("RAY_AUTH_MODE=%s ignored: the emulated cluster always uses token auth",
                    os.environ["RAY_AUTH_MODE"])
    if not os.environ.get("RAY_AUTH_TOKEN"):
        ensure_ray_auth_token(ray_auth_token_file())
    os.environ.update(client_env())
    from ray._private import ray_constants
    from ray._raylet import AuthenticationTokenLoader, Config

    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import: the env var is for children
    Config.initialize("")  # this process may have read RAY_AUTH_MODE earlier
    AuthenticationTokenLoader.instance().reset_cache()


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
