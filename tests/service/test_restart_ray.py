"""Restart safety on Ray: SIGKILL ``frenzy serve --backend ray`` (emulated one-GPU cluster)
while a real training job runs with a checkpoint written and two jobs wait for its GPU, start
it again on the same SQLite file.

Checked, each against facts gathered outside the service: the killed service's Ray processes
(read from ``/proc`` before the kill) are all gone and its Ray folder removed once the new one
is up; the running job resumes from the newest checkpoint file on disk at the kill (its
trainer says so) and succeeds; the queued jobs are placed and succeed; every job has one
``submitted`` event; the GPUs the database holds are the GPUs Ray holds (a second driver
connected to the new cluster reads Ray's resources and placement groups), and none are left
held at the end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from serve_helpers import Served, db_rows, serve

from orchestrator.emulated import client_env

pytestmark = pytest.mark.ray

SOLO = """name: solo
inter_node_bw_gbs: 12.5
nodes:
  - {id: solo, gpu_type: A100-80G, count: 1, interconnect: pcie}
"""
CKPT_EVERY = 20
LONG_STEPS = 600  # a tiny model makes ~30-50 steps/s on a busy core (more on a quiet one)


def _job(name: str, steps: int) -> dict[str, Any]:
    return {"dimensions": {"name": name, "family": "gpt2", "num_layers": 2, "hidden_size": 64,
                           "num_heads": 4, "vocab_size": 512, "max_seq_len": 128},
            "training": {"global_batch": 8, "seq_len": 64, "steps": steps,
                         "precision": "fp32"},
            "max_gpus": 1}


# -- processes, read from /proc -------------------------------------------------------------
def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of ``pid``; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), fields[0]


def _alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[1] not in ("Z", "X")  # a zombie has already exited


def _descendants(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (st := _stat(int(entry.name))) is not None:
            children.setdefault(st[0], []).append(int(entry.name))
    out: set[int] = set()
    todo = [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if c not in out:
                out.add(c)
                todo.append(c)
    return {p for p in out if _alive(p)}


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    except OSError:
        return []


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    except OSError:
        return {}
    return dict(kv.split("=", 1) for kv in raw.split("\0") if "=" in kv)


def _ray_folder(pids: set[int]) -> Path:
    """The Ray folder (``RAY_TMPDIR``) the processes among ``pids`` were started with."""
    folders = {e["RAY_TMPDIR"] for p in pids if "RAY_TMPDIR" in (e := _environ(p))}
    assert len(folders) == 1, folders
    return Path(folders.pop())


def _gcs_address(pids: set[int]) -> str:
    """The GCS address the raylet among ``pids`` was started with (``--gcs-address``)."""
    for pid in pids:
        argv = _cmdline(pid)
        if argv and argv[0].endswith("raylet"):
            return next(a.split("=", 1)[1] for a in argv if a.startswith("--gcs-address="))
    raise AssertionError(f"no raylet among {sorted(pids)}")


def _reap_dead_owners() -> None:
    from orchestrator.emulated import reap_stale_clusters  # imports Ray: only when needed

    reap_stale_clusters()


def _kill_all(pids: set[int]) -> None:
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


# -- Ray's own view, from a second driver ------------------------------------------------------
RAY_PROBE = """
import json, sys, ray
from ray.util.placement_group import placement_group_table
ray.init(address=sys.argv[1], namespace="frenzy", log_to_driver=False)
for _ in sys.stdin:
    pgs = [p["name"] for p in placement_group_table().values()
           if str(p.get("name", "")).startswith("frenzy-") and p.get("state") != "REMOVED"]
    used = ray.cluster_resources().get("GPU", 0.0) - ray.available_resources().get("GPU", 0.0)
    print(json.dumps({"gpus_used": used, "pgs": sorted(pgs)}), flush=True)
"""


class RayProbe:
    """A driver process connected to the service's cluster, answering one snapshot per line."""

    def __init__(self, address: str) -> None:
        env = {**os.environ, **client_env()}  # the cluster is closed: token and loopback
        env.pop("RAY_ADDRESS", None)
        self.proc = subprocess.Popen([sys.executable, "-c", RAY_PROBE, address], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)

    def snapshot(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """Ray's view now (the first call waits for the probe to connect)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        assert ready, f"the Ray probe did not answer within {timeout_s:.0f} s"
        line = self.proc.stdout.readline()
        assert line, "the Ray probe died"
        return json.loads(line)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None:
                f.close()


# -- database ------------------------------------------------------------------------------
def _held(url: str) -> list[tuple[str, str, int]]:
    return sorted(db_rows(url, "SELECT job_id, node_id, gpus FROM allocations "
                               "WHERE released_at IS NULL"))


def _states(s: Served) -> dict[str, str]:
    page = s.client.get("/v1/jobs", params={"limit": 100}).json()
    return {j["id"]: j["state"] for j in page["data"]}


def _latest_checkpoint(ckpt: Path, job_id: str) -> int:
    """Newest ``step-NNNNNNNN.pt`` of the job (the trainer's layout), 0 when none."""
    steps = [int(m.group(1)) for f in (ckpt / job_id).glob("step-*.pt")
             if (m := re.fullmatch(r"step-(\d{8})\.pt", f.name))]
    return max(steps, default=0)


def _consistent(url: str, probe: RayProbe, *, busy: bool, timeout_s: float = 30.0
                ) -> tuple[list[tuple[str, str, int]], dict[str, Any]]:
    """Allocation rows and Ray's view, read back to back, once the rows did not change
    around Ray's snapshot (the database follows Ray by a loop turn) and agree with it: as
    many GPUs held, one placement group per holding job. ``busy``: only a snapshot with a
    GPU held counts (a job between two others holds none)."""
    deadline = time.monotonic() + timeout_s
    while True:
        held = _held(url)
        snap = probe.snapshot()
        if _held(url) == held and sum(g for *_, g in held) == snap["gpus_used"] \
                and len(snap["pgs"]) == len({j for j, *_ in held}) and bool(held) == busy:
            return held, snap
        assert time.monotonic() < deadline, f"database {held} vs Ray {snap}"
        time.sleep(0.2)


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], None]]]:
    """Callbacks run at the end, last first, whatever happened (processes, folders)."""
    todo: list[Callable[[], None]] = []
    yield todo
    for fn in reversed(todo):
        with contextlib.suppress(Exception):
            fn()


@pytest.mark.timeout(300)
def test_sigkill_on_ray_requeues_from_checkpoint_and_leaks_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cleanup: list[Callable[[], None]]
) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # the service starts its own cluster
    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    cluster = tmp_path / "solo.yaml"
    cluster.write_text(SOLO)
    ckpt = tmp_path / "ckpt"
    env = {"FRENZY_CHECKPOINT_DIR": str(ckpt), "FRENZY_CHECKPOINT_EVERY": str(CKPT_EVERY)}
    args = dict(backend="ray", extra=["--cluster", str(cluster)], env_extra=env,
                timeout_s=120.0)
    seen: set[int] = set()  # every process the services started, for the cleanup
    folders: list[Path] = []
    # Last resort: a service that died before its processes were listed here (e.g. one
    # that did not come up) leaves a cluster with a dead owner: reap those.
    cleanup.append(_reap_dead_owners)
    cleanup.append(lambda: [shutil.rmtree(f, ignore_errors=True) for f in folders])
    cleanup.append(lambda: _kill_all(seen))

    # 1. One GPU: a long job trains, two short ones wait for its GPU. They are submitted once
    # it holds the GPU: submitted together, the shortest-remaining-time queue would start
    # them first (whenever the scheduler's tick saw all three pending).
    s1 = serve(tmp_path, url, **args)
    cleanup.append(lambda: s1.proc.poll() is None and s1.kill())
    try:
        long_job = s1.submit(_job("long", LONG_STEPS))["id"]
        s1.wait_for(lambda: _states(s1)[long_job] in ("placed", "starting", "running"),
                    timeout_s=90, what="the long job holding the GPU")
        queued = [s1.submit(_job(name, 3))["id"] for name in ("q1", "q2")]
        s1.wait_for(lambda: _latest_checkpoint(ckpt, long_job) >= CKPT_EVERY
                    and _states(s1)[long_job] == "running", timeout_s=90,
                    what="the job running, with a checkpoint")
        before = _states(s1)
        ray1 = _descendants(s1.proc.pid)
        seen |= ray1
        folder1 = _ray_folder(ray1)
        folders.append(folder1)
    finally:
        s1.kill()
    assert before[long_job] == "running", before
    assert [before[j] for j in queued] == ["pending", "pending"], before
    assert _held(url) == [(long_job, "solo", 1)]

    # 2. SIGKILL: Ray's GCS and raylet die with the service (kernel fate sharing); the
    # trainer follows its raylet. Only then is the newest checkpoint final.
    deadline = time.monotonic() + 30
    while (trainers := {p for p in ray1 if _alive(p) and "TrainingWorker" in
                        " ".join(_cmdline(p))}) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not trainers, "the killed service's training worker is still running"
    resume_at = _latest_checkpoint(ckpt, long_job)
    assert resume_at >= CKPT_EVERY and resume_at % CKPT_EVERY == 0

    # 3. Start again on the same database.
    s2 = serve(tmp_path, url, **args)
    cleanup.append(s2.stop)
    ray2 = _descendants(s2.proc.pid)
    seen |= ray2
    folders.append(_ray_folder(ray2))
    address = _gcs_address(ray2)
    leftovers = {p: " ".join(_cmdline(p))[:80] for p in ray1 if _alive(p)}
    assert not leftovers, f"processes of the killed service left running: {leftovers}"
    assert not folder1.exists(), f"the killed service's Ray folder {folder1} was left"

    probe = RayProbe(address)
    cleanup.append(probe.close)
    probe.snapshot()  # connected before the checks below start their clocks
    s2.wait_for(lambda: _states(s2)[long_job] in ("running", "succeeded"), timeout_s=60,
                what="the job running again")
    # While the jobs run one after the other, the database and Ray agree on who holds the
    # GPU: one job, on solo, in a placement group named after it.
    held, snap = _consistent(url, probe, busy=True)
    assert len(held) == 1 and held[0][1:] == ("solo", 1), held
    assert snap["gpus_used"] == 1 and held[0][0] in snap["pgs"][0], (held, snap)

    for j in (long_job, *queued):
        s2.wait_for(lambda j=j: _states(s2)[j] == "succeeded", timeout_s=90,
                    what=f"job {j} succeeded")
    job = s2.job(long_job)
    assert job["progress"]["steps_done"] == LONG_STEPS
    events = s2.client.get(f"/v1/jobs/{long_job}/events").json()["data"]
    kinds = [e["kind"] for e in events]
    assert kinds.count("requeued") == 1, kinds
    (requeued,) = db_rows(url, f"SELECT data FROM events WHERE kind='requeued' "
                               f"AND job_id='{long_job}'")
    assert json.loads(requeued[0])["steps_done"] == resume_at  # not the progress last seen
    # The trainer itself reports where the new launch started: the checkpoint on disk.
    log_text = s2.log_path.read_text(errors="replace")
    assert f"job {long_job}: first step made (launch resumed from step {resume_at})" \
        in log_text, s2.log()
    held, snap = _consistent(url, probe, busy=False)
    assert held == [] and snap == {"gpus_used": 0, "pgs": []}, (held, snap)
    after = _states(s2)
    ray2 |= _descendants(s2.proc.pid)
    seen |= ray2
    s2.stop()
    probe.close()

    assert set(after) == set(before) and set(after.values()) == {"succeeded"}, after
    submitted = Counter(j for (j,) in db_rows(url, "SELECT job_id FROM events "
                                                   "WHERE kind='submitted'"))
    assert submitted == Counter({j: 1 for j in before})
    assert _held(url) == []
    # A graceful stop leaves nothing either.
    deadline = time.monotonic() + 30
    while (left := {p for p in ray2 if _alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, {p: " ".join(_cmdline(p))[:80] for p in left}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc (Linux)")
def test_reap_stale_clusters_kills_only_what_dead_owners_left(tmp_path: Path) -> None:
    """Without Ray: a folder whose owner is gone loses its processes (found by the file they
    hold open there) and is removed; a folder whose owner lives, or that names no owner, is
    left alone."""
    from orchestrator.emulated import OWNER_FILE, TEMP_PREFIX, reap_stale_clusters

    gone = subprocess.Popen(["true"])
    gone.wait()  # a pid that no longer runs
    hold = 'exec 3>>"$0"; echo x >&3; exec sleep 120'  # sleep keeps the log open
    folders = {name: tmp_path / f"{TEMP_PREFIX}{name}" for name in ("dead", "live", "anon")}
    holders = {}
    for name, folder in folders.items():
        folder.mkdir()
        log = folder / "ray" / "x.log"
        log.parent.mkdir()
        holders[name] = subprocess.Popen(["sh", "-c", hold, str(log)])
        owner = {"dead": gone.pid, "live": os.getpid(), "anon": None}[name]
        if owner is not None:
            start = Path(f"/proc/{owner}/stat").read_text() if owner == os.getpid() else ""
            started = start[start.rindex(")") + 2:].split()[19] if start else "1"
            (folder / OWNER_FILE).write_text(f"{owner} {started}\n")
    try:
        deadline = time.monotonic() + 30
        while not all((log := f / "ray" / "x.log").exists() and log.stat().st_size
                      for f in folders.values()):
            assert time.monotonic() < deadline, "the holders did not start"
            time.sleep(0.05)
        assert reap_stale_clusters(tmp_path) == 1
        assert holders["dead"].wait(timeout=10) == -signal.SIGKILL
        assert not folders["dead"].exists()
        assert holders["live"].poll() is None and folders["live"].is_dir()
        assert holders["anon"].poll() is None and folders["anon"].is_dir()
    finally:
        for p in holders.values():
            p.kill()
            p.wait()
