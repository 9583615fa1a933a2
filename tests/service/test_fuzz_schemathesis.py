"""Schema-driven fuzzing: schemathesis generates requests from /openapi.json against a running
``frenzy serve`` (admin token, SQLite); no request may get a 5xx.

The logs endpoint is fuzzed too, in a run of its own: a ``follow=true`` request on a job that
does not end within the run streams until the server's ``logs_follow_max_s`` (2 s here) ends
it. One schemathesis worker: two threads now and then crash hypothesis inside CPython 3.11's
``ast`` module ("AST constructor recursion depth mismatch", python/cpython#106905)."""

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
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}",
              env_extra={"FRENZY_LOGS_FOLLOW_MAX_S": "2"})
    base = [ST, "run", f"{s.url}/openapi.json", "--checks", "not_a_server_error",
            "-H", f"Authorization: Bearer {s.token}", "--seed", "1", "--workers", "1",
            "--request-timeout", "20", "--phases", "examples,fuzzing"]
    try:
        # the logs endpoint in a run of its own, so its draws do not reshuffle the others'
        runs = [subprocess.run([*base, "--max-examples", "12", "--exclude-path-regex", "/logs$"],
                               capture_output=True, text=True, timeout=240),
                subprocess.run([*base, "--max-examples", "8", "--include-path-regex", "/logs$"],
                               capture_output=True, text=True, timeout=240)]
    finally:
        s.stop()
    for out in runs:
        assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
