"""User code is contained: every escape found when probing as an attacker with a normal job
must fail. The attacker is a real entrypoint run by ``run_entrypoint`` (as a Ray worker runs
it), trying each escape and writing what happened into its own checkpoint folder; the test
then checks the outcome from outside (files unchanged, processes gone) as well.

Needs root (CI and the development machine run as root): only root can start the
entrypoint under the job's own uid. Without it these tests skip; the degraded mode has its
own test below."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from orchestrator import sandbox
from orchestrator.trainer import checkpoint as ckpt
from orchestrator.trainer import entrypoint
from orchestrator.trainer.entrypoint import run_entrypoint
from orchestrator.trainer.loop import Control, RunConfig

needs_root = pytest.mark.skipif(not sandbox.can_switch_user(),
                                reason="only root can run entrypoints under their own uid")

SECRETS = {"DATABASE_URL": "sqlite:////nowhere/secret-db-url",
           "FRENZY_TOKEN": "frz-secret-admin-token", "RAY_AUTH_TOKEN": "ray-secret-token",
           "FRENZY_SOME_SETTING": "frz-secret-setting"}
PROTOCOL = {"WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "TP_SIZE",
            "PP_SIZE", "DP_SIZE", "MICRO_BATCH_SIZE", "GLOBAL_BATCH_SIZE",
            "CUDA_VISIBLE_DEVICES", "FRENZY_JOB_ID", "FRENZY_CHECKPOINT_DIR",
            "FRENZY_TOTAL_STEPS", "FRENZY_RESUME_STEP", "FRENZY_STOP_FILE", "FRENZY_EXPORT_DIR"}
BASE = {"PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "LANG", "PYTHONUNBUFFERED",
        "PWD"}  # bwrap --chdir sets PWD (the home)


@pytest.fixture(params=["uid", "bwrap"])
def layer(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Run the test with the uid rules alone, and again inside bubblewrap where it works."""
    monkeypatch.setenv(sandbox.BWRAP_ENV, "1" if request.param == "bwrap" else "0")
    if request.param == "bwrap" and not sandbox.bwrap_usable(
            sandbox.job_uid("probe", 0), sandbox.job_gid("probe")):
        pytest.skip("bubblewrap is not installed or does not work for job uids here")
    return str(request.param)


class Service:
    """What a service on this node holds: a 0600 database and admin token file in a
    readable folder, the checkpoint root, and two other users' jobs with checkpoints."""

    def __init__(self, tmp: Path) -> None:
        self.var = tmp / "var"
        self.var.mkdir()
        os.chmod(self.var, 0o755)  # readable folder: the files' own modes must hold
        self.db = self.var / "frenzy.db"
        with sqlite3.connect(self.db) as con:
            con.execute("create table api_tokens (owner text, is_admin int)")
            con.execute("insert into api_tokens values ('alice', 0)")
        os.chmod(self.db, 0o600)
        self.token = self.var / "admin-token"
        self.token.write_text("frz-admin-0123456789\n")
        os.chmod(self.token, 0o600)
        self.root = self.var / "checkpoints"
        # a built-in trainer job of another user: its folder as checkpoint.save makes it
        self.builtin = self.root / "victim-builtin"
        self.builtin.mkdir(parents=True, mode=0o700)
        for step in (2, 4):
            (self.builtin / f"step-{step:08d}.pt").write_bytes(b"real checkpoint")
        # an entrypoint job of another user: its folder as the sandbox makes it
        box = sandbox.prepare(self.root, "victim-ep", 0)
        (box.checkpoint_dir / "model.bin").write_bytes(b"their weights")
        os.chmod(box.checkpoint_dir / "model.bin", 0o660)
        box.close(None)
        self.victim_ep = box.checkpoint_dir

    def db_rows(self) -> list[tuple[str, int]]:
        with sqlite3.connect(self.db) as con:
            return list(con.execute("select owner, is_admin from api_tokens"))


def run(svc: Service, job_id: str, script: str, control: Control | None = None) -> Path:
    """Run ``script`` as rank 0 of ``job_id``; returns the job's checkpoint folder."""
    cfg = RunConfig(job_id=job_id, model=None, global_batch=1, seq_len=0, total_steps=1,
                    checkpoint_dir=str(svc.root),
                    entrypoint=(sandbox.job_python(), "-c", textwrap.dedent(script)))
    run_entrypoint(cfg, 0, control or Control())
    return svc.root / job_id


ATTACK = """
    import json, os, pathlib, sqlite3, subprocess
    out = {}
    def attempt(name, fn):
        try:
            out[name] = ["escaped", repr(fn())[:200]]
        except Exception as e:
            out[name] = [type(e).__name__, str(e)[:200]]
    var = pathlib.Path(VAR)
    root = var / "checkpoints"
    def write_db():
        con = sqlite3.connect(var / "frenzy.db")
        con.execute("insert into api_tokens values ('mallory', 1)")
        con.commit()
    attempt("read_token", lambda: (var / "admin-token").read_text())
    attempt("read_db", lambda: (var / "frenzy.db").read_bytes()[:16])
    attempt("write_db", write_db)
    def list_others():  # under bwrap the root shows just the job's own (bound) folder
        others = [n for n in os.listdir(root) if n != os.environ["FRENZY_JOB_ID"]]
        if not others:
            raise LookupError("only its own folder")
        return others
    attempt("list_root", list_others)
    attempt("list_builtin", lambda: os.listdir(root / "victim-builtin"))
    attempt("list_ep", lambda: os.listdir(root / "victim-ep"))
    attempt("read_ep", lambda: (root / "victim-ep" / "model.bin").read_bytes())
    fake = "step-99999999.pt"
    attempt("plant_builtin", lambda: (root / "victim-builtin" / fake).write_bytes(b"x"))
    attempt("plant_ep", lambda: (root / "victim-ep" / fake).write_bytes(b"x"))
    attempt("read_logs", lambda: os.listdir(root / ".logs"))
    out["uid"], out["gid"], out["groups"] = os.getuid(), os.getgid(), os.getgroups()
    out["env"] = dict(os.environ)
    out["cwd"] = os.getcwd()
    ck = pathlib.Path(os.environ["FRENZY_CHECKPOINT_DIR"])
    (ck / "mine.txt").write_text("own folder is writable")
    survivor = subprocess.Popen(["setsid", "sleep", "300"], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    out["survivor"] = survivor.pid
    (ck / "report.json").write_text(json.dumps(out))
    print("frenzy step=1 loss=0.5", flush=True)
"""


@needs_root
def test_an_entrypoint_cannot_reach_the_service_or_other_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    svc = Service(tmp_path)
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("FRENZY_TOKEN_FILE", str(svc.token))
    t0 = time.monotonic()
    ck = run(svc, "attacker", ATTACK.replace("VAR", repr(str(svc.var))))
    took = time.monotonic() - t0
    report = json.loads((ck / "report.json").read_text())
    escaped = {k: v for k, v in report.items()
               if isinstance(v, list) and v and v[0] == "escaped"}
    assert escaped == {}, escaped
    for probe in ("read_token", "read_db", "write_db", "list_root", "list_builtin", "list_ep",
                  "read_ep", "plant_builtin", "plant_ep", "read_logs"):
        # bwrap: what lies under the private /tmp is not even there
        allowed = ("PermissionError", "OperationalError") + (
            ("FileNotFoundError", "LookupError") if layer == "bwrap" else ())
        assert report[probe][0] in allowed, (probe, report)
    # its own ids: not root, not the service's groups, one gid per job
    assert report["uid"] == sandbox.job_uid("attacker", 0) >= sandbox.ID_BASE
    assert report["gid"] == sandbox.job_gid("attacker") != sandbox.job_gid("victim-ep")
    assert report["groups"] == []
    # a clean environment: protocol variables and a minimal base, no secrets
    env = report["env"]
    assert set(env) <= PROTOCOL | BASE, set(env) - PROTOCOL - BASE
    leaked = [k for k, v in SECRETS.items() if any(v in x for x in env.values())]
    assert leaked == [] and str(svc.token) not in json.dumps(env)
    assert env["HOME"] == report["cwd"] and not env["HOME"].startswith(str(svc.root))
    # from outside: nothing changed, the planted files do not exist
    assert svc.db_rows() == [("alice", 0)]
    assert sorted(p.name for p in svc.builtin.iterdir()) == ["step-00000002.pt",
                                                             "step-00000004.pt"]
    assert ckpt.latest_step(svc.root, "victim-builtin") == 4
    assert sorted(p.name for p in svc.victim_ep.iterdir()) == ["model.bin"]
    assert (ck / "mine.txt").read_text() == "own folder is writable"
    # the setsid process ended with the job (under bwrap its pid is the namespace's own: the
    # host view is the uid's process list)
    if layer == "uid":
        assert not _alive(report["survivor"]), f"pid {report['survivor']} outlived its job"
    assert sandbox.uid_processes(report["uid"]) == []
    assert took < 20


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


@needs_root
def test_a_background_process_holding_the_output_does_not_keep_the_job_alive(
        tmp_path: Path, layer: str) -> None:
    """The main process exits at once; a ``setsid`` child keeps stdout open and forks a
    grandchild: the run returns promptly and none of them is left."""
    svc = Service(tmp_path)
    script = """
        import os, pathlib, subprocess
        ck = pathlib.Path(os.environ["FRENZY_CHECKPOINT_DIR"])
        p = subprocess.Popen(["setsid", "sh", "-c", "sleep 300 & echo $! > {ck}/gc; sleep 300"])
        (ck / "child").write_text(str(p.pid))
        print("frenzy step=1", flush=True)
    """.replace("{ck}", str(svc.root / "holder"))
    t0 = time.monotonic()
    ck = run(svc, "holder", script)
    assert time.monotonic() - t0 < 15
    for name in ("child", "gc"):
        deadline = time.monotonic() + 2
        while not (ck / name).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if name == "gc" and not (ck / name).exists():
            # the sweep ended the setsid shell before it forked the grandchild (a race the
            # job loses on a loaded machine): nothing to outlive; the uid check below holds
            continue
        pid = int((ck / name).read_text())
        assert layer == "bwrap" or not _alive(pid), f"{name} {pid} outlived its job"
    assert sandbox.uid_processes(sandbox.job_uid("holder", 0)) == []


ACTOR = """
import sys
from orchestrator.sandbox import job_python
from orchestrator.trainer.entrypoint import run_entrypoint
from orchestrator.trainer.loop import Control, RunConfig
cfg = RunConfig(job_id="orphaned", model=None, global_batch=1, seq_len=0, total_steps=1,
                checkpoint_dir=sys.argv[1], entrypoint=(job_python(), "-c", sys.argv[2]))
run_entrypoint(cfg, 0, Control())
"""


@needs_root
def test_the_job_ends_when_its_worker_is_killed(tmp_path: Path, layer: str) -> None:
    """``ray.kill`` on cancel SIGKILLs the worker: no code of it runs after that, yet the
    entrypoint and its ``setsid`` child must not outlive it (the watchdog ends them)."""
    svc = Service(tmp_path)
    script = textwrap.dedent("""
        import os, pathlib, subprocess, time
        ck = pathlib.Path(os.environ["FRENZY_CHECKPOINT_DIR"])
        p = subprocess.Popen(["setsid", "sleep", "300"])
        (ck / "pids").write_text(f"{os.getpid()} {p.pid}")
        print("frenzy step=1", flush=True)
        time.sleep(300)
    """)
    root = Path(__file__).resolve().parents[2]
    actor = subprocess.Popen([sys.executable, "-c", ACTOR, str(svc.root), script],
                             env={**os.environ, "PYTHONPATH": str(root)})
    pids_file = svc.root / "orphaned" / "pids"
    deadline = time.monotonic() + 60
    while not pids_file.exists() and time.monotonic() < deadline:
        assert actor.poll() is None, "the worker stand-in exited early"
        time.sleep(0.1)
    uid = sandbox.job_uid("orphaned", 0)
    if layer == "bwrap":  # the pids written are the namespace's: look from the host by uid
        pids = sandbox.uid_processes(uid)
        assert len(pids) >= 3  # bwrap, its pid-1 helper or the script, the sleeper
    else:
        pids = [int(p) for p in pids_file.read_text().split()]
    assert all(_alive(p) for p in pids)
    actor.kill()
    actor.wait()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(p) for p in pids), f"{pids} outlived their killed worker"
    assert sandbox.uid_processes(uid) == []


@needs_root
def test_output_stays_in_the_jobs_log_not_in_the_failure_reason(tmp_path: Path) -> None:
    svc = Service(tmp_path)
    script = """
        import sys
        print("frenzy step=1", flush=True)
        print("SECRET-OUTPUT-7f3a: the dataset password is hunter2", flush=True)
        sys.exit(3)
    """
    with pytest.raises(RuntimeError) as err:
        run(svc, "leaky", script)
    reason = str(err.value)
    assert "code 3" in reason and "rank 0" in reason and "rank-0.log" in reason
    assert "SECRET" not in reason and "hunter2" not in reason
    log = svc.root / sandbox.LOG_DIR / "leaky" / "rank-0.log"
    assert "SECRET-OUTPUT-7f3a" in log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o600
    assert stat.S_IMODE(log.parent.stat().st_mode) == 0o700


@needs_root
def test_the_log_is_capped_and_an_unreachable_program_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(sandbox.BWRAP_ENV, "0")  # bwrap would report the exec failure itself
    svc = Service(tmp_path)
    monkeypatch.setattr(sandbox, "LOG_LIMIT_BYTES", 100)
    run(svc, "chatty", "print('x' * 999, flush=True)\nprint('frenzy step=1', flush=True)\n")
    text = (svc.root / sandbox.LOG_DIR / "chatty" / "rank-0.log").read_text()
    assert text == "x" * 100 + "\n[frenzy: log cut at 100 bytes]\n"
    hidden = tmp_path / "private"
    hidden.mkdir(mode=0o700)
    prog = hidden / "train.sh"
    prog.write_text("#!/bin/sh\nexit 0\n")
    prog.chmod(0o755)
    cfg = RunConfig(job_id="unreachable", model=None, global_batch=1, seq_len=0, total_steps=1,
                    checkpoint_dir=str(svc.root), entrypoint=(str(prog),))
    with pytest.raises(RuntimeError, match=r"cannot start the entrypoint .*train.sh.*"
                                           r"Permission denied"):
        run_entrypoint(cfg, 0, Control())


@needs_root
def test_a_stop_ignored_ends_the_whole_process_group(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layer: str) -> None:
    """The stop file is the service's (the job cannot replace it); a job that ignores it
    gets SIGTERM on its group after the grace period and the run counts as stopped."""
    svc = Service(tmp_path)
    monkeypatch.setattr(entrypoint, "STOP_GRACE_S", 0.5)
    control = Control()
    script = """
        import os, pathlib, signal, time
        ck = pathlib.Path(os.environ["FRENZY_CHECKPOINT_DIR"])
        stop = pathlib.Path(os.environ["FRENZY_STOP_FILE"])
        try:
            stop.parent.joinpath("mine").write_text("x")
            (ck / "stop_dir").write_text("writable")
        except OSError:  # EACCES; EROFS under bwrap
            (ck / "stop_dir").write_text("service-owned")
        print("frenzy step=1", flush=True)
        while not stop.exists():
            time.sleep(0.05)
        (ck / "saw_stop").write_text("1")
        time.sleep(300)
    """
    t0 = time.monotonic()
    import threading

    def stop_soon() -> None:
        while control.status.get("steps_done") != 1:
            time.sleep(0.05)
        control.stop.set()

    threading.Thread(target=stop_soon, daemon=True).start()
    cfg = RunConfig(job_id="stubborn", model=None, global_batch=1, seq_len=0, total_steps=5,
                    checkpoint_dir=str(svc.root),
                    entrypoint=(sandbox.job_python(), "-c", textwrap.dedent(script)))
    result = run_entrypoint(cfg, 0, control)
    assert result.stopped and not result.finished and result.steps_done == 1
    ck = svc.root / "stubborn"
    assert (ck / "saw_stop").exists() and (ck / "stop_dir").read_text() == "service-owned"
    assert time.monotonic() - t0 < 15


@needs_root
def test_planted_checkpoints_never_push_out_the_real_ones(tmp_path: Path) -> None:
    """Even where a foreign file lands in a built-in job's folder (here put there by root
    and given to another uid), it is neither loaded nor a reason to delete real ones."""
    d = tmp_path / "job"
    d.mkdir(mode=0o700)
    for step in (2, 4):
        (d / f"step-{step:08d}.pt").write_bytes(b"real")
    planted = d / "step-99999999.pt"
    planted.write_bytes(b"fake")
    os.chown(planted, sandbox.job_uid("mallory", 0), sandbox.job_gid("mallory"))
    (d / "step-00000010.pt").symlink_to(d / "step-00000002.pt")
    assert ckpt.latest_step(tmp_path, "job") == 4
    (d / "step-00000006.pt").write_bytes(b"real")
    ckpt._prune(d, keep=2, saved=6)
    assert sorted(p.name for p in d.iterdir()) == [
        "step-00000004.pt", "step-00000006.pt", "step-00000010.pt", "step-99999999.pt"]
    assert ckpt.latest_step(tmp_path, "job") == 6
    # a folder owned by someone else is not the trainer's: nothing in it is trusted
    os.chown(d, sandbox.job_uid("mallory", 0), -1)
    assert ckpt.latest_step(tmp_path, "job") == 0


def test_job_ids_that_are_not_plain_names_are_refused(tmp_path: Path) -> None:
    for bad in ("../etc", ".logs", "a/b", "", "x" * 129):
        with pytest.raises(ValueError, match="cannot name a folder"):
            sandbox.prepare(tmp_path, bad, 0)


def test_require_refuses_to_run_uncontained(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "can_switch_user", lambda: False)
    monkeypatch.setenv(sandbox.MODE_ENV, "require")
    with pytest.raises(sandbox.SandboxError, match="cannot start the entrypoint"):
        sandbox.prepare(tmp_path, "job", 0)
    monkeypatch.setenv(sandbox.MODE_ENV, "auto")
    box = sandbox.prepare(tmp_path, "job", 0)  # degraded: still private folders, no uid
    assert box.uid is None and stat.S_IMODE(box.checkpoint_dir.stat().st_mode) == 0o700
    box.close(None)


def test_ids_are_per_job_and_per_rank_and_out_of_the_account_range() -> None:
    ids = {sandbox.job_uid("a", 0), sandbox.job_uid("a", 1), sandbox.job_uid("b", 0)}
    assert len(ids) == 3
    assert sandbox.job_gid("a") != sandbox.job_gid("b")
    assert sandbox.job_uid("a", 0) == sandbox.job_uid("a", 0)  # every node derives the same
    assert all(sandbox.ID_BASE <= i < sandbox.ID_BASE + sandbox.ID_SPAN < 2**31 for i in ids)
