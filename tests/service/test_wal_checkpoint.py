"""SQLite WAL checkpoints off the commit path: an engine made with ``auto_checkpoint=False``
never checkpoints inside a commit (the WAL grows past SQLite's 1,000-page trigger), and
``WalCheckpointer`` copies it back on its own thread."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from service.db.engine import WalCheckpointer, make_engine

PAGE = 4096
ROWS = 30  # commits of 100 pages each: 3,000 pages written, 3 x SQLite's trigger


def _write(engine: sa.Engine) -> None:
    with engine.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE IF NOT EXISTS blobs (b BLOB)")
    for _ in range(ROWS):
        with engine.begin() as conn:
            conn.exec_driver_sql("INSERT INTO blobs VALUES (zeroblob(?))", (100 * PAGE,))


def _wal(db: Path) -> int:
    return Path(f"{db}-wal").stat().st_size


def test_commits_leave_the_wal_to_the_checkpointer(tmp_path: Path) -> None:
    db = tmp_path / "off.db"
    engine = make_engine(f"sqlite:///{db}", auto_checkpoint=False)
    try:
        _write(engine)
        assert _wal(db) >= ROWS * 100 * PAGE  # every page still in the WAL
        busy, frames, done = WalCheckpointer(engine, 1.0).checkpoint()
        assert busy == 0 and frames >= ROWS * 100 and done == frames
    finally:
        engine.dispose()


def test_by_default_commits_checkpoint(tmp_path: Path) -> None:
    db = tmp_path / "on.db"
    engine = make_engine(f"sqlite:///{db}")
    try:
        _write(engine)
        # reset after each 1,000-page checkpoint: the file stays near that size
        assert _wal(db) < ROWS * 100 * PAGE / 2
    finally:
        engine.dispose()


def test_the_checkpointer_runs_on_its_own_thread_until_stopped(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'bg.db'}", auto_checkpoint=False)
    cp = WalCheckpointer(engine, 0.02).start()
    try:
        _write(engine)
        time.sleep(0.2)
        assert cp.checkpoints >= 2
    finally:
        cp.stop()
        engine.dispose()
    stopped = cp.checkpoints
    time.sleep(0.1)
    assert cp.checkpoints == stopped
    with pytest.raises(ValueError, match="interval_s"):
        WalCheckpointer(engine, 0)
