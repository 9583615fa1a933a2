"""Schema-driven fuzzing: schemathesis generates requests from /openapi.json against a running
``frenzy serve`` (admin token, SQLite); no request may get a 5xx.

The logs endpoint is left out: with ``follow=true`` it streams until the job ends, and the
generated jobs do not end within the run (tests/service/test_job_logs.py covers it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from serve_helpers import serve

ST = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")

pytestmark = pytest.mark.skipif(not Path(ST).exists(),
                                reason="schemathesis not installed (pip install -e '.[dev]')")


def test_no_server_errors(tmp_path: Path) -> None:
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}")
    try:
        out = subprocess.run(
            [ST, "run", f"{s.url}/openapi.json", "--checks", "not_a_server_error",
             "-H", f"Authorization: Bearer {s.token}", "--max-examples", "12", "--seed", "1",
             "--workers", "2", "--request-timeout", "20", "--phases", "examples,fuzzing",
             "--exclude-path-regex", "/logs$"],
            capture_output=True, text=True, timeout=240,
        )
    finally:
        s.stop()
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
