"""Containment for user code: how an entrypoint process is started, confined and ended.

A job's ``entrypoint`` is code the service did not write, so each rank runs it as

* **its own unprivileged ids**: uid ``job_uid(job, rank)`` and gid ``job_gid(job)``, numbers
  from a range no account uses (``ID_BASE`` … ``ID_BASE + ID_SPAN``), derived from the job id
  so every node of a multi-node job picks the same ones without talking to the others (in
  the manner of systemd's ``DynamicUser``; no passwd entry is needed). No supplementary
  groups. Ranks of one job share the gid, jobs never do (up to a hash collision, about
  n²/2·``ID_SPAN`` for n jobs);
* **a clean environment**: only the documented protocol variables (``WORLD_SIZE``, ``RANK``,
  …, ``FRENZY_JOB_ID``, ``FRENZY_CHECKPOINT_DIR``, ``FRENZY_TOTAL_STEPS``,
  ``FRENZY_RESUME_STEP``, ``FRENZY_STOP_FILE``, ``FRENZY_EXPORT_DIR``) plus a minimal
  ``PATH``, ``HOME``, ``TMPDIR``, ``USER`` and locale. Nothing of the service's own
  environment is inherited: no ``DATABASE_URL``, ``FRENZY_*`` settings or token paths, no
  ``RAY_*`` (auth token);
* **folders of its own**: the checkpoint folder ``<checkpoint_root>/<job_id>`` is owned by
  the service with the job's group, mode ``2770`` (setgid: the ranks' files keep the group;
  they run with umask 007), so only the job's ranks and the service can enter it; a private
  per-rank run folder on the node (mode ``0711``, the service's) holds the rank's home and
  working directory (``0700``, the rank's uid) and the stop file, which only the service
  writes. A job that ships a working directory gets a copy of it there (``work/``, the
  rank's own; ``JobBox.install_workdir``) and starts in it. The checkpoint root is
  ``0711``: a job can reach its own folder by name but cannot
  list the others; the built-in trainer's folders are ``0700`` (``checkpoint.py``). The
  folders above the root get the search bit (``o+x``) if they lack it, never read;
* **an end shared with the job**: the entrypoint leads its own session and process group;
  when it exits or is stopped, the group gets SIGKILL and then so does every process left
  with the rank's uid, including ones that called ``setsid`` (a helper running as that uid
  sends ``kill(-1, SIGKILL)`` until no process of the uid is alive). When the worker itself
  dies first (``ray.kill`` on cancel, a crash), a watchdog does the same: a small process in
  its own session, started before the entrypoint, that waits for the end of a pipe only the
  worker holds (``python -m orchestrator.sandbox watch``);
* **output kept in its own log**: the service-owned ``<checkpoint_root>/.logs/<job_id>/``
  folder (``0700``), up to ``LOG_LIMIT_BYTES`` per rank and launch, the previous launch's
  kept as ``rank-N.log.1`` (served by ``GET /v1/jobs/{id}/logs``); a failure reason names
  the exit code and that log, never the output.

Where bubblewrap is installed (Debian package ``bubblewrap``) and works for the job's uid
(probed once per process), the entrypoint also runs inside ``bwrap``: its own pid namespace
(it sees only its own processes, and all of them die with ``bwrap``, which dies with the
worker), a read-only view of ``/`` in which only its home and checkpoint folder are
writable, a private empty ``/tmp`` (whatever the service keeps there is invisible), its own
IPC and hostname namespaces; devices (GPUs) and the network stay shared (ranks rendezvous
over it). Without bwrap the uid rules above hold alone. ``FRENZY_SANDBOX_BWRAP=0`` turns it
off.

What it needs: the worker (the Ray actor) runs as root, as it does in the emulated cluster,
in CI and in the docker-compose set-up. Under another user it cannot change uid: the
default (``FRENZY_SANDBOX=auto``) then still cleans the environment, uses the private
folders and kills the process group, but logs a warning on every launch that the job runs
with the worker's own uid (it could read what that user can read, and a ``setsid`` process
can outlive it); ``FRENZY_SANDBOX=require`` refuses to run entrypoints instead (what a
production node should set). Not covered without more from the platform: ``/tmp`` and the
network are shared (a job can reach loopback ports, where the API and Ray need their tokens),
and memory/CPU are not capped; a bubblewrap or container runtime per node adds those.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

ID_BASE = 1_500_000_000
ID_SPAN = 500_000_000
"""Job uids and gids are drawn from [ID_BASE, ID_BASE + ID_SPAN): far above any account and
below 2^31 (some tools read ids as signed 32-bit numbers)."""
MODE_ENV = "FRENZY_SANDBOX"
BWRAP_ENV = "FRENZY_SANDBOX_BWRAP"
LOG_DIR = ".logs"
KILL_TIMEOUT_S = 5.0
LOG_LIMIT_BYTES = 64 * 1024 * 1024
"""Output characters kept per rank and launch; the rest is dropped (a note says so): a job
cannot fill the service's disk by printing."""
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class SandboxError(RuntimeError):
    """The entrypoint cannot be run contained as required."""


def _id_for(key: str) -> int:
    digest = hashlib.sha256(key.encode()).digest()
    return ID_BASE + int.from_bytes(digest[:8], "big") % ID_SPAN


def job_gid(job_id: str) -> int:
    """The group every rank of ``job_id`` runs with (owns its checkpoint folder)."""
    return _id_for(f"gid:{job_id}")


def job_uid(job_id: str, rank: int) -> int:
    """The user rank ``rank`` of ``job_id`` runs as (one per rank: its processes are found
    and ended by uid without touching the other ranks on the same node)."""
    return _id_for(f"uid:{job_id}:{rank}")


def check_job_id(job_id: str) -> str:
    """``job_id`` when it is safe as a folder name, else ``ValueError`` saying what fits."""
    if not _JOB_ID.match(job_id):
        raise ValueError(f"job id {job_id!r} cannot name a folder: use 1-128 letters, digits, "
                         "'_', '.' or '-', starting with a letter or digit")
    return job_id


def can_switch_user() -> bool:
    """Whether this process may start children under other uids (root on Linux)."""
    return hasattr(os, "geteuid") and os.geteuid() == 0 and sys.platform.startswith("linux")


def job_python() -> str:
    """An interpreter a job's uid can execute: this one when every folder on its path is
    searchable by others, else the system ``python3`` (for examples and tests; a job's
    environment has ``PATH`` = the system folders)."""
    exe = Path(os.path.realpath(sys.executable))
    if all(os.stat(p).st_mode & stat.S_IXOTH for p in exe.parents):
        return sys.executable
    return shutil.which("python3", path=SYSTEM_PATH) or sys.executable


def _grant_search(root: Path) -> None:
    """Give others the search bit on ``root``'s ancestors that lack it (never read)."""
    for parent in reversed(root.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            log.warning("sandbox: adding o+x (search only) to %s so job users can reach %s",
                        parent, root)
            os.chmod(parent, stat.S_IMODE(mode) | stat.S_IXOTH)


def _private_dir(path: Path, mode: int, uid: int | None = None, gid: int | None = None) -> Path:
    """Create ``path`` (not through a symlink), then set its owner and mode."""
    path.mkdir(parents=True, exist_ok=True)
    st = path.lstat()
    if not stat.S_ISDIR(st.st_mode):
        raise SandboxError(f"{path} is not a folder (a symlink?): refusing to use it")
    if uid is not None or gid is not None:
        os.chown(path, -1 if uid is None else uid, -1 if gid is None else gid,
                 follow_symlinks=False)
    os.chmod(path, mode)
    return path


@dataclass
class JobBox:
    """One rank's containment: its ids, folders and environment, and how to end it."""

    job_id: str
    rank: int
    uid: int | None  # None: not switching users (not root; see the module docstring)
    gid: int | None
    checkpoint_dir: Path
    run_dir: Path
    home: Path
    stop_file: Path
    log_path: Path
    watchdog: subprocess.Popen[bytes] | None = None
    bwrap: bool = False
    workdir: Path | None = None  # the job's working directory, copied in (install_workdir)

    @property
    def cwd(self) -> Path:
        """Where the entrypoint starts: its copy of the job's working directory, else its
        home."""
        return self.workdir or self.home

    def install_workdir(self, src: str | Path) -> Path:
        """Copy the job's working directory ``src`` into the rank's home as ``work/``, owned
        by the rank (the entrypoint then starts there). A copy, not ``src`` itself: under Ray
        ``src`` is the node's unpacked ``runtime_env`` package, a cache shared by every
        worker whose folder has the same content (another job's ranks included), so a job
        must not be able to write to it. Symlinks are copied as links, never followed by the
        service: the job reads what they point to with its own uid or not at all."""
        source = Path(src)
        if not source.is_dir():
            raise SandboxError(f"working directory {source} is not a folder on this node")
        dest = self.home / "work"
        shutil.copytree(source, dest, symlinks=True)
        if self.uid is not None:
            for path in (dest, *dest.rglob("*")):
                os.chown(path, self.uid, self.gid, follow_symlinks=False)
        os.chmod(dest, 0o700)
        self.workdir = dest
        return dest

    def env(self, protocol: Mapping[str, str]) -> dict[str, str]:
        """The entrypoint's whole environment: ``protocol`` plus a minimal base."""
        user = f"frenzy-job-{self.uid}" if self.uid is not None else "frenzy-job"
        exe_dir = str(Path(job_python()).parent)
        path = SYSTEM_PATH if exe_dir in SYSTEM_PATH.split(":") else f"{exe_dir}:{SYSTEM_PATH}"
        return {"PATH": path, "HOME": str(self.home), "TMPDIR": str(self.home / "tmp"),
                "USER": user, "LOGNAME": user, "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1",
                **{k: v for k, v in protocol.items() if not k.startswith("RAY_")}}

    def popen(self, argv: Sequence[str], env: Mapping[str, str]) -> subprocess.Popen[str]:
        """Start ``argv`` contained: own ids, session, folder and environment."""
        ids: dict[str, object] = {}
        if self.uid is not None:
            ids = {"user": self.uid, "group": self.gid, "extra_groups": []}
        if self.bwrap:
            argv = bwrap_argv(self, argv)
        return subprocess.Popen(list(argv), env=dict(env), cwd=self.cwd, umask=0o007,
                                start_new_session=True, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", close_fds=True, **ids)  # type: ignore[arg-type]

    def open_log(self) -> _CappedLog:
        """The rank's output log (see ``open_rank_log``)."""
        return open_rank_log(self.log_path)

    def request_stop(self) -> None:
        """Create the stop file the entrypoint polls for."""
        self.stop_file.touch()

    def terminate(self, proc: subprocess.Popen[str]) -> None:
        """SIGTERM to the entrypoint's process group (end of the stop grace period)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)

    def kill_all(self, proc: subprocess.Popen[str] | None) -> int:
        """SIGKILL the process group, then every process left with the rank's uid.
        Returns how many processes of the uid were still alive after the group kill."""
        if proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        if self.uid is None:
            return 0
        return kill_uid(self.uid, self.gid)

    def close(self, proc: subprocess.Popen[str] | None) -> None:
        """End every process of the rank, its watchdog, and remove its run folder."""
        self.kill_all(proc)
        if self.watchdog is not None:
            with contextlib.suppress(OSError):
                self.watchdog.stdin.close()  # type: ignore[union-attr]
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.watchdog.wait(timeout=KILL_TIMEOUT_S)
        shutil.rmtree(self.run_dir, ignore_errors=True)


MAX_WORKDIR_ENTRIES = 100_000
"""Files and folders a shipped working directory may hold (walked at submission and launch)."""


def check_shippable(folder: str | Path) -> None:
    """``ValueError`` unless every file of ``folder`` could be read by any user of this
    machine (``o+r``; folders ``o+rx``), symlinks judged by what they point to.

    The service reads and ships a job's working directory with its own rights, and the job
    then owns its copy: without this rule a job could name the service's own files (its
    database, its tokens: ``0600``) or link to them from an innocent folder, and read them.
    Things every local user can read already leak nothing by being shipped."""
    root = Path(folder)

    def entries() -> Iterator[Path]:
        yield root
        # links to folders are followed, as the packaging follows them (a link loop ends
        # at the entry cap)
        for top, dirs, files in os.walk(root, followlinks=True):
            for name in (*dirs, *files):
                yield Path(top) / name

    for count, path in enumerate(entries(), start=1):
        if count > MAX_WORKDIR_ENTRIES:
            raise ValueError(f"{root} holds more than {MAX_WORKDIR_ENTRIES:,} files and "
                             "folders; ship only the code (.gitignore / .rayignore)")
        try:
            st = path.stat()  # follows symlinks: what would be packaged
        except OSError as exc:
            raise ValueError(f"{path}: cannot be read ({exc.strerror})") from None
        need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(st.st_mode) else 0)
        if st.st_mode & need != need:
            kind = "folder" if stat.S_ISDIR(st.st_mode) else "file"
            link = f" (a link to {os.path.realpath(path)})" if path.is_symlink() else ""
            raise ValueError(f"{path}{link} is a {kind} not readable by every user "
                             f"(mode {stat.S_IMODE(st.st_mode):o}); a working_dir is shipped "
                             "only when all of it is (chmod -R o+rX), so a job cannot ship "
                             "files only the service may read")


def open_rank_log(path: Path) -> _CappedLog:
    """A rank's output log (service-owned folder; never opened through a symlink). The
    previous launch's log is kept as ``rank-N.log.1`` (one generation: a rank's logs stay
    under twice ``LOG_LIMIT_BYTES``)."""
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, path.with_name(path.name + ".1"))
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    return _CappedLog(os.fdopen(fd, "w", encoding="utf-8", errors="replace", buffering=1))


def private_log_dir(checkpoint_root: str | Path, job_id: str) -> Path:
    """``<checkpoint_root>/.logs/<job_id>``, created ``0700`` (service-owned) if missing."""
    root = Path(checkpoint_root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    logs = _private_dir(root / LOG_DIR, 0o700)
    return _private_dir(logs / check_job_id(job_id), 0o700)


class _CappedLog:
    """A text log that keeps the first ``LOG_LIMIT_BYTES`` characters written to it."""

    def __init__(self, f: IO[str]) -> None:
        self._f = f
        self._left = LOG_LIMIT_BYTES

    def write(self, text: str) -> None:
        if self._left <= 0:
            return
        data = text[:self._left]
        self._left -= len(data)
        self._f.write(data)
        if self._left <= 0:
            self._f.write(f"\n[frenzy: log cut at {LOG_LIMIT_BYTES} bytes]\n")

    def __enter__(self) -> _CappedLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()


def bwrap_argv(box: JobBox, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped in bubblewrap (see the module docstring)."""
    return ["bwrap", "--die-with-parent", "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
            "--tmpfs", "/tmp", "--ro-bind", str(box.run_dir), str(box.run_dir),
            "--bind", str(box.home), str(box.home),
            "--bind", str(box.checkpoint_dir), str(box.checkpoint_dir),
            "--chdir", str(box.cwd), "--", *argv]


_bwrap_ok: bool | None = None


def bwrap_usable(uid: int | None, gid: int | None) -> bool:
    """Whether entrypoints get bubblewrap: installed, not turned off, and a trial run under
    ``uid`` works (it needs unprivileged user namespaces). Probed once per process."""
    global _bwrap_ok
    if os.environ.get(BWRAP_ENV, "1") == "0" or uid is None or not shutil.which("bwrap"):
        return False
    if _bwrap_ok is None:
        trial = subprocess.run(
            ["bwrap", "--die-with-parent", "--unshare-pid", "--ro-bind", "/", "/",
             "--proc", "/proc", "--tmpfs", "/tmp", "--", "/bin/true"],
            user=uid, group=gid, extra_groups=[], env={"PATH": SYSTEM_PATH}, cwd="/",
            capture_output=True, text=True, check=False)
        _bwrap_ok = trial.returncode == 0
        if not _bwrap_ok:
            log.warning("sandbox: bwrap is installed but fails for job uids (%s): entrypoints "
                        "run with the uid rules only", trial.stderr.strip()[:200])
    return _bwrap_ok


def uid_processes(uid: int) -> list[int]:
    """Live (not zombie) processes whose real uid is ``uid`` (Linux ``/proc``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("Uid", "-1 0").split()[0]) == uid and \
                not fields.get("State", "").strip().startswith(("Z", "X")):
            pids.append(int(entry.name))
    return pids


def kill_uid(uid: int, gid: int | None, timeout_s: float = KILL_TIMEOUT_S) -> int:
    """SIGKILL every process of ``uid`` until none is left; returns how many were found
    at first. A helper running as ``uid`` calls ``kill(-1, SIGKILL)``: the kernel then
    signals all of them at once, so a process that forks while we look is caught too."""
    first = uid_processes(uid)
    deadline = time.monotonic() + timeout_s
    left = first
    while left and time.monotonic() < deadline:
        subprocess.run(["/bin/sh", "-c", "kill -9 -1"], user=uid, group=gid,
                       extra_groups=[], env={"PATH": SYSTEM_PATH}, cwd="/",
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
        time.sleep(0.01)
        left = uid_processes(uid)
    if left:
        log.error("sandbox: processes %s of uid %d survived SIGKILL for %.0f s", left, uid,
                  timeout_s)
    return len(first)


def prepare(checkpoint_root: str | Path, job_id: str, rank: int) -> JobBox:
    """Set up rank ``rank`` of ``job_id``'s containment (see the module docstring)."""
    check_job_id(job_id)
    mode = os.environ.get(MODE_ENV, "auto")
    if mode not in ("auto", "require"):
        raise SandboxError(f"{MODE_ENV}={mode!r}: use 'auto' or 'require'")
    switch = can_switch_user()
    if not switch:
        if mode == "require":
            raise SandboxError(f"{MODE_ENV}=require but the worker runs as uid {os.geteuid()} "
                               "and cannot start the entrypoint under its own uid; run the "
                               "Ray workers as root")
        log.warning("sandbox: NOT CONTAINED: the worker is not root, so job %s rank %d runs "
                    "as the worker's own uid %d (clean environment and process group only; "
                    "set %s=require to refuse)", job_id, rank, os.geteuid(), MODE_ENV)
    uid = job_uid(job_id, rank) if switch else None
    gid = job_gid(job_id) if switch else None
    root = Path(checkpoint_root).absolute()
    root.mkdir(parents=True, exist_ok=True)
    if switch:
        _grant_search(root)
        os.chmod(root, 0o711)
    ckdir = _private_dir(root / job_id, 0o2770 if switch else 0o700, os.geteuid(), gid)
    logs = private_log_dir(root, job_id)
    run_dir = Path(tempfile.mkdtemp(prefix=f"frenzy-run-{job_id[:16]}-{rank}-"))
    if switch:
        os.chmod(run_dir, 0o711)
        _grant_search(run_dir)
    home = _private_dir(run_dir / "home", 0o700, uid, gid)
    _private_dir(home / "tmp", 0o700, uid, gid)
    watchdog = None
    if switch:  # an earlier launch of this rank may have left processes (a killed worker)
        kill_uid(uid, gid)  # type: ignore[arg-type]
        watchdog = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.sandbox", "watch", str(uid), str(gid),
             str(run_dir)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True,
            cwd="/", env={**os.environ, "PYTHONPATH": _package_root()})
    return JobBox(job_id=job_id, rank=rank, uid=uid, gid=gid, checkpoint_dir=ckdir,
                  run_dir=run_dir, home=home, stop_file=run_dir / "stop",
                  log_path=logs / f"rank-{rank}.log", watchdog=watchdog,
                  bwrap=bwrap_usable(uid, gid))


def _package_root() -> str:
    """The folder that holds the ``orchestrator`` package (for the watchdog's imports)."""
    return str(Path(__file__).resolve().parents[1])


def _watch(uid: int, gid: int, run_dir: str) -> None:
    """Watchdog body: block until the worker's end of the pipe closes (it finished, or
    died), then end every process of ``uid`` and remove the run folder."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(4096):
        pass
    kill_uid(uid, gid)
    shutil.rmtree(run_dir, ignore_errors=True)


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "watch":
    _watch(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
