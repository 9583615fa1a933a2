"""Tokens: revocation and expiry take effect on the next request, one token can be revoked
by id, and the secrets on disk (the admin token file, the SQLite database) are readable by
their owner only, from the moment they exist.

Findings (issue 15): revoked tokens worked for 5 s (a cache); tokens never expired; the
admin token file was briefly 0644 before the chmod; the SQLite file was world-readable."""

from __future__ import annotations

import argparse
import os
import stat
from datetime import timedelta
from pathlib import Path

import pytest
from security_helpers import Env

from service.auth import create_token, parse_duration, write_private_file
from service.db import repositories as repo
from service.db.engine import make_engine, write_session
from service.db.models import Token
from service.serve_cli import ensure_admin_token
from service.tokens_cli import add_token_parser, run_token


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_revoked_token_fails_on_the_next_request(env: Env) -> None:
    h = env.headers("alice")
    assert env.client.get("/v1/jobs", headers=h).status_code == 200
    with write_session(env.factory) as s:  # as `frenzy token revoke` does, elsewhere
        assert repo.revoke_tokens(session=s, owner="alice") == 1
    r = env.client.get("/v1/jobs", headers=h)
    assert r.status_code == 401
    assert r.json()["detail"] == "Authorization: unknown, revoked or expired token"
    assert env.client.get("/v1/jobs", headers=env.headers("bob")).status_code == 200


def test_expired_token_fails(env: Env) -> None:
    with write_session(env.factory) as s:
        token = create_token(session=s, owner="carol", now=env.clock(),
                             expires_in=timedelta(hours=1))
    h = {"Authorization": f"Bearer {token}"}
    assert env.client.get("/v1/jobs", headers=h).status_code == 200
    env.clock.advance(3599)
    assert env.client.get("/v1/jobs", headers=h).status_code == 200
    env.clock.advance(1)  # expires_at is exclusive: at the instant it stops working
    assert env.client.get("/v1/jobs", headers=h).status_code == 401


def _cli(url: str, *argv: str) -> int:
    parser = argparse.ArgumentParser()
    add_token_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["token", *argv, "--database-url", url])
    return run_token(args)


def test_cli_expiry_and_revocation_by_id(
        db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert _cli(db_url, "create", "--owner", "dave", "--expires-in", "7d") == 0
    first = capsys.readouterr()
    assert _cli(db_url, "create", "--owner", "dave") == 0
    second = capsys.readouterr()
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(Token.__table__.select().order_by(Token.id)).all()
        assert [(r.owner, r.expires_at is None) for r in rows] == [("dave", False),
                                                                  ("dave", True)]
        assert rows[0].expires_at - rows[0].created_at == timedelta(days=7)
        assert f"token {rows[0].id} for dave; expires: " in first.err
        assert _cli(db_url, "revoke", str(rows[0].id)) == 0  # one token, by id
        assert f"revoked token {rows[0].id} of dave" in capsys.readouterr().err
        with engine.connect() as conn:
            revoked = [r.revoked_at is not None for r in
                       conn.execute(Token.__table__.select().order_by(Token.id))]
        assert revoked == [True, False]
        assert second.out.startswith("frz_")
        assert _cli(db_url, "revoke", "999999") == 1
        assert _cli(db_url, "create", "--owner", "dave", "--expires-in", "soon") == 2
        assert "--expires-in: 'soon' is not a duration" in capsys.readouterr().err
        assert _cli(db_url, "list", "--owner", "dave") == 0
        listing = capsys.readouterr().out.splitlines()
        assert len(listing) == 3 and listing[1].split()[:3] == [str(rows[0].id), "dave", "no"]
    finally:
        engine.dispose()


def test_parse_duration() -> None:
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("2w") == timedelta(days=14)
    assert parse_duration("3600s") == timedelta(hours=1)
    for bad in ("0d", "-1d", "7", "d", "1.5h", "7 days"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


def test_token_file_is_never_readable_by_others(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    modes: list[int] = []
    real_replace = os.replace

    def spy(src: str | Path, dst: str | Path) -> None:  # the temporary file, before rename
        modes.append(_mode(Path(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    old = os.umask(0)  # the most permissive umask: the mode must not come from it
    try:
        path = tmp_path / "cfg" / "frenzy" / "token"
        write_private_file(path, "frz_secret\n")
        url = f"sqlite:///{tmp_path / 'db' / 'frenzy.db'}"
        from service.db.engine import migrate

        migrate(url)
        served = tmp_path / "served" / "token"
        token = ensure_admin_token(url, served)
    finally:
        os.umask(old)
    assert modes == [0o600, 0o600]
    assert _mode(path) == 0o600 and path.read_text() == "frz_secret\n"
    assert _mode(served) == 0o600 and served.read_text().strip() == token
    assert _mode(path.parent) == 0o700
    assert not [p for p in path.parent.iterdir() if p.name != "token"]  # no temp left


def test_sqlite_database_files_are_private(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        db = tmp_path / "new" / "frenzy.db"
        engine = make_engine(f"sqlite:///{db}")
        with engine.connect() as conn:  # WAL mode: the -wal and -shm files appear
            conn.exec_driver_sql("CREATE TABLE t (x)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
            conn.commit()
            files = [db, Path(f"{db}-wal"), Path(f"{db}-shm")]
            assert [_mode(p) for p in files] == [0o600] * 3
        engine.dispose()
        existing = tmp_path / "old.db"
        existing.touch(mode=0o644)
        existing.chmod(0o644)
        make_engine(f"sqlite:///{existing}").dispose()
        assert _mode(existing) == 0o600
    finally:
        os.umask(old)


READ_COUNT = """import sys, sqlite3
c = sqlite3.connect(sys.argv[1])
print(c.execute("SELECT count(*) FROM t").fetchone()[0])
c.close()
"""


def test_second_engine_keeps_the_first_engines_sqlite_locks(tmp_path: Path) -> None:
    """Making another engine on a database this process already uses (the service makes
    several) must not drop the first engine's POSIX locks: if it did, another process closing
    its connection takes the file as unused, checkpoints and deletes the WAL, and later
    commits of this process never reach other readers (the Ray restart test read a frozen
    allocations table)."""
    import subprocess
    import sys

    db = tmp_path / "frenzy.db"
    first = make_engine(f"sqlite:///{db}")
    try:
        with first.begin() as conn:  # a pooled connection stays open in WAL mode
            conn.exec_driver_sql("CREATE TABLE t (x)")
            conn.exec_driver_sql("INSERT INTO t VALUES (1)")
        make_engine(f"sqlite:///{db}").dispose()

        def other_process_count() -> int:
            out = subprocess.run([sys.executable, "-c", READ_COUNT, str(db)], check=True,
                                 capture_output=True, text=True, timeout=60)
            return int(out.stdout)

        assert other_process_count() == 1  # opens and closes its own connection
        assert Path(f"{db}-wal").exists()  # still this process's WAL, not checkpointed away
        for _ in range(3):
            with first.begin() as conn:
                conn.exec_driver_sql("INSERT INTO t VALUES (2)")
        assert other_process_count() == 4  # 1 + 3 commits, seen from outside
    finally:
        first.dispose()
