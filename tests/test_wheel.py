"""The built wheel works on its own: it is built from the sources, installed into a fresh
virtualenv and run from a directory outside the checkout, so every data file the commands
read (GPU catalog, cluster descriptions, dashboard, migrations) must come from the wheel.

The fresh venv gets the heavy dependencies (torch, Ray, ...) by a ``.pth`` line naming the
running interpreter's site-packages: a plain path line, so that directory's own ``.pth`` files
(the editable install of this checkout among them) are not processed, and it comes after the
venv's own site-packages, so the wheel's modules win. The test checks that they did.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import sysconfig
import time
import tomllib
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTBED_TYPES = {"A100-40G", "A800-80G", "A100-80G"}  # orchestrator/data/clusters/frenzy-testbed


def _copy_sources(dest: Path) -> None:
    """What the build reads: pyproject.toml and the packages it lists (no build/, no caches)."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    dest.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", dest)
    for pattern in meta["tool"]["setuptools"]["packages"]["find"]["include"]:
        name = pattern.rstrip("*")
        shutil.copytree(ROOT / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))


def _can_build_in_place() -> bool:
    """setuptools new enough for pyproject.toml's build-system here (no download needed)."""
    try:
        import setuptools
    except ImportError:
        return False
    return int(setuptools.__version__.split(".")[0]) >= 68


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with only the wheel installed, plus a path to the dependencies."""
    work = tmp_path_factory.mktemp("wheel")
    src, dist, env_dir = work / "src", work / "dist", work / "venv"
    _copy_sources(src)
    isolation = ["--no-build-isolation"] if _can_build_in_place() else []
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q",
                    "-w", str(dist), str(src)], check=True, timeout=300)
    (wheel,) = dist.glob("frenzy-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True,
                   timeout=120)
    py = env_dir / "bin" / "python"
    # pip of this interpreter installs into the new venv; it sees nothing of this checkout.
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps",
                    "--no-index", "-q", str(wheel)], check=True, timeout=300)
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()"
                                "['purelib'])"], check=True, capture_output=True, text=True,
                               timeout=60).stdout.strip())
    deps = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "_frenzy_test_deps.pth").write_text("".join(f"{d}\n" for d in deps))
    return env_dir


@pytest.fixture
def outside(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the checkout and an environment that names no checkout."""
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "DATABASE_URL", "VIRTUAL_ENV")
           and not k.startswith("FRENZY_")}
    env.update(HOME=str(tmp_path), XDG_CONFIG_HOME=str(tmp_path / "config"),
               PYTHONUNBUFFERED="1", RAY_AUTH_MODE="disabled")
    return cwd, env


def _run(venv: Path, outside: tuple[Path, dict[str, str]], *args: str) -> str:
    cwd, env = outside
    proc = subprocess.run([str(venv / "bin" / "frenzy"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"frenzy {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_installed_wheel_is_what_runs(venv: Path,
                                          outside: tuple[Path, dict[str, str]]) -> None:
    cwd, env = outside
    code = ("import json, predictor.gpus as g, orchestrator.clusters as c, service.cli, "
            "simulator.cli, migrations; print(json.dumps([g.__file__, str(g.CATALOG_PATH), "
            "c.__file__, str(c.PACKAGED_DIR), service.cli.__file__, simulator.cli.__file__, "
            "migrations.__file__]))")
    out = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=env,
                         capture_output=True, text=True, check=True, timeout=120).stdout
    for f in json.loads(out):
        assert Path(f).is_relative_to(venv), f"{f} is not from the installed wheel"
        assert not Path(f).is_relative_to(ROOT)


def test_plan(venv: Path, outside: tuple[Path, dict[str, str]]) -> None:
    out = json.loads(_run(venv, outside, "plan", "--model", "llama-2-7b", "--batch", "64",
                          "--seq", "4096", "--gpus", "A100-80G,A800-80G", "--top", "3",
                          "--json"))
    assert out["model"] == "llama-2-7b" and out["feasible"]
    assert len(out["plans"]) == 3
    assert {p["gpu_type"] for p in out["plans"]} <= {"A100-80G", "A800-80G"}
    # Llama-2-7B: 6,738,415,616 parameters (its Hugging Face checkpoint)
    assert out["params"] == pytest.approx(6.74e9, rel=0.01)


def test_simulate(venv: Path, outside: tuple[Path, dict[str, str]]) -> None:
    last = _run(venv, outside, "simulate", "--cluster", "phoebe", "--trace",
                "newworkload-20@1", "--max-jobs", "20", "--policy", "has", "--json",
                "--no-progress").strip().splitlines()[-1]
    out = json.loads(last)
    assert out["cluster"] == "phoebe" and out["gpus"] == 44  # 3×8 + 2×8 + 1×4
    run = out["results"]["newworkload-20@1"]["has"]
    assert run["jobs"] == 20 and run["unfinished"] == 0


def test_unknown_cluster_lists_packaged_names(venv: Path,
                                              outside: tuple[Path, dict[str, str]]) -> None:
    cwd, env = outside
    proc = subprocess.run([str(venv / "bin" / "frenzy"), "simulate", "--cluster", "nope",
                           "--trace", "newworkload-2", "--no-progress"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "frenzy-testbed, hetero-128, phoebe" in proc.stderr


def _head_revision() -> str:
    """The revision of migrations/versions that no other revision names as its parent."""
    revs, parents = set(), set()
    for f in (ROOT / "migrations" / "versions").glob("*.py"):
        text = f.read_text(encoding="utf-8")
        rev = re.search(r'^revision\s*=\s*"([^"]+)"', text, re.M)
        if rev:
            revs.add(rev.group(1))
            parents.update(re.findall(r'^down_revision\s*=\s*"([^"]+)"', text, re.M))
    (head,) = revs - parents
    return head


def test_migrate(venv: Path, outside: tuple[Path, dict[str, str]]) -> None:
    db = outside[0] / "migrated.db"
    _run(venv, outside, "migrate", "--database-url", f"sqlite:///{db}")
    with sqlite3.connect(db) as conn:
        assert conn.execute("select version_num from alembic_version").fetchall() == [
            (_head_revision(),)]
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
    assert "jobs" in tables


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_sim_backend(venv: Path, outside: tuple[Path, dict[str, str]]) -> None:
    cwd, env = outside
    port = _free_port()
    token_file = cwd / "token"
    log_path = cwd / "serve.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [str(venv / "bin" / "frenzy"), "serve", "--backend", "sim", "--port", str(port),
             "--database-url", f"sqlite:///{cwd / 'frenzy.db'}", "--token-file", str(token_file)],
            cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, f"frenzy serve exited:\n{log_path.read_text()[-4000:]}"
            assert time.monotonic() < deadline, f"no health:\n{log_path.read_text()[-4000:]}"
            try:
                health = httpx.get(f"{url}/healthz", timeout=1.0)
                if health.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert health.json() == {"status": "ok"}
        assert httpx.get(f"{url}/", timeout=10).status_code == 200  # dashboard from the wheel
        headers = {"Authorization": f"Bearer {token_file.read_text().strip()}"}
        cluster = httpx.get(f"{url}/v1/cluster", headers=headers, timeout=10).json()
        assert cluster["total_gpus"] == 11  # the default cluster, frenzy-testbed: 2+1+4+2×2
        plans = httpx.post(f"{url}/v1/plans", headers=headers, timeout=60, json={
            "model": "llama-2-7b", "training": {"global_batch": 64, "seq_len": 4096}}).json()
        assert plans["plans"], plans
        assert {p["gpu_type"] for p in plans["plans"]} <= TESTBED_TYPES
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
