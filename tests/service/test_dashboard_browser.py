"""The dashboard in headless Chromium against a running ``frenzy serve``: the submitted jobs
and the cluster's nodes appear on the page, the job page draws its plans and memory chart,
and a screenshot is saved as docs/dashboard.png."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import sqlalchemy as sa
from serve_helpers import ROOT, serve

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--virtual-time-budget=6000"]

pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists(),
    reason="needs Debian's chromium (apt-get install -y chromium); CI installs it",
)


def _chromium(*args: str) -> str:
    with tempfile.TemporaryDirectory() as profile:
        out = subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                             capture_output=True, text=True, timeout=60)
    return out.stdout


def test_dashboard_shows_jobs_and_nodes(tmp_path: Path) -> None:
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}")
    try:
        tiny = s.submit({"dimensions": {"name": "tiny", "family": "gpt2", "num_layers": 2,
                                        "hidden_size": 64, "num_heads": 4, "vocab_size": 512,
                                        "max_seq_len": 128}, "max_gpus": 1,
                         "training": {"global_batch": 8, "seq_len": 64, "steps": 10_000_000}})
        big = [s.submit({"model": "llama-2-7b", "training": {"global_batch": 64,
                                                             "seq_len": 4096, "steps": 1000}})
               for _ in range(3)]
        s.wait_for(lambda: s.job(tiny["id"])["state"] == "running", what="a running job")
        page = f"{s.url}/#token={s.token}"
        dom = _chromium("--dump-dom", page)
        for node in ("head", "a800", "a100-80g-0", "a100-40g"):
            assert f'data-node="{node}"' in dom, f"node {node} missing"
        for job in (tiny, *big):
            assert job["id"][:8] in dom, f"job {job['id']} missing"
        assert 'class="gpu held"' in dom and "util-chart" in dom
        # the admin's page: an owner column in the job lists, and the per-user table
        owner = s.job(tiny["id"])["owner"]
        assert f'<tr data-job="{tiny["id"]}"><td><a href="/jobs/{tiny["id"]}" ' in dom
        assert f'{tiny["id"][:8]}</a></td><td>{owner}</td>' in dom
        assert '<section id="users-card" class="card">' in dom  # shown: an admin's token
        assert f'<tr data-owner="{owner}"><td>{owner}</td>' in dom

        job_dom = _chromium("--dump-dom", f"{s.url}/jobs/{big[0]['id']}#token={s.token}")
        assert "memory-chart" in job_dom and "4×A100-80G" in job_dom
        assert "no training report yet" in job_dom
        queued = [j for j in big if s.job(j["id"])["state"] == "pending"]
        if queued:  # a queued job says why, with numbers, on its page and in the queue
            q_dom = _chromium("--dump-dom", f"{s.url}/jobs/{queued[0]['id']}#token={s.token}")
            assert "waiting [" in q_dom and " needs " in q_dom

        # the sim backend reports steps only: give the running job two step windows
        windows = [{"at": f"2026-11-24T12:00:0{i}Z", "step": 5 * i, "loss": 4.0 - i,
                    "tokens_per_s": 16384.0, "step_time_s": 2.0, "predicted_step_time_s": 1.6,
                    "memory_bytes": 3 * 2**20, "predicted_memory_bytes": 5 * 2**19}
                   for i in (1, 2)]
        engine = sa.create_engine(f"sqlite:///{tmp_path / 'frenzy.db'}")
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET metrics = :m WHERE id = :id"),
                         {"m": json.dumps(windows), "id": tiny["id"]})
        engine.dispose()
        tiny_dom = _chromium("--dump-dom", f"{s.url}/jobs/{tiny['id']}#token={s.token}")
        assert "loss-chart" in tiny_dom and "loss 2.0000" in tiny_dom
        assert "step 2.000 s (predicted 1.600 s)" in tiny_dom
        assert "memory 3.0 MiB (predicted 2.5 MiB)" in tiny_dom
        assert "step-chart-svg" in tiny_dom and "mem-chart-svg" in tiny_dom
        assert "tensor memory per rank: measured (blue) vs predicted" in tiny_dom

        # CI must not dirty the tree: the committed screenshot is refreshed on request only
        # (FRENZY_WRITE_DOCS=1 pytest tests/service/test_dashboard_browser.py).
        docs = os.environ.get("FRENZY_WRITE_DOCS") == "1"
        shot = ROOT / "docs" / "dashboard.png" if docs else tmp_path / "dashboard.png"
        _chromium("--window-size=1400,1000", f"--screenshot={shot}", page)
        assert shot.exists() and shot.stat().st_size > 10_000
    finally:
        s.stop()
