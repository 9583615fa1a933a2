"""A bounded schemathesis run against the API under uvicorn, on SQLite and on PostgreSQL:
no generated request may get a 5xx (NUL bytes, surrogates, huge numbers and deep objects
are among what it generates; the specific cases have their own tests here).

The logs endpoint is fuzzed too, in a run of its own: no job ends in this app (no control
loop), so a generated ``follow=true`` request streams until the server's
``logs_follow_max_s`` (2 s here) ends it.

One schemathesis worker: with two threads, CPython 3.11's ``ast`` module (which hypothesis
uses to describe its strategies) now and then fails with "SystemError: AST constructor
recursion depth mismatch" (python/cpython#106905), a fuzzer crash rather than a finding."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from security_helpers import start_server

ST = shutil.which("schemathesis") or str(Path(sys.executable).parent / "schemathesis")

pytestmark = pytest.mark.skipif(not Path(ST).exists(),
                                reason="schemathesis not installed (pip install -e '.[dev]')")


def test_no_server_errors(db_url: str, tmp_path: Path) -> None:
    server = start_server(db_url, tmp_path, FRENZY_LOGS_FOLLOW_MAX_S="2")
    base = [ST, "run", f"{server.url}/openapi.json", "--checks", "not_a_server_error",
            "-H", f"Authorization: Bearer {server.token}", "--seed", "15", "--workers", "1",
            "--request-timeout", "20", "--phases", "examples,coverage,fuzzing"]
    try:
        # the logs endpoint in a run of its own, so its draws do not reshuffle the others'
        runs = [subprocess.run([*base, "--max-examples", "25", "--exclude-path-regex", "/logs$"],
                               capture_output=True, text=True, timeout=400),
                subprocess.run([*base, "--max-examples", "10", "--include-path-regex", "/logs$"],
                               capture_output=True, text=True, timeout=400)]
    finally:
        server.stop()
    for out in runs:
        assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:] + server.log()
