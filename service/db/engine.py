"""Engines, sessions and migrations for the service database.

SQLite (the embedded default) runs in WAL mode with a busy timeout so many readers and one
writer proceed together; transactions that write start with ``BEGIN IMMEDIATE`` (see
``write_session``) so two writers queue on the busy timeout instead of failing with
"database is locked" when one of them read first. PostgreSQL uses a pooled psycopg 3 engine.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic.config import Config
from sqlalchemy import event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

log = logging.getLogger(__name__)

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
ALEMBIC_INI = MIGRATIONS_DIR.parent / "alembic.ini"

_BEGIN_OPTION = "frenzy_sqlite_begin"

class _SqliteWriteLock:
    """This process's writers of one SQLite file, queued; then the file's writers of every
    process, queued on an ``flock`` of ``<database>-wlock`` next to it.

    SQLite admits one writer at a time; a writer that finds the file locked sleeps in its
    busy handler (1, 2, 5 ... 100 ms) and polls, so under load most of a request's time was
    spent asleep after the lock had already been freed. Queueing on a thread lock and then
    on a blocking ``flock`` hands the file over the moment the previous transaction ends,
    within this process and across the API worker processes and the Controller's; the busy
    timeout still arbitrates against writers that do not take the lock (other tools).
    """

    def __init__(self, path: str | None) -> None:
        self._thread_lock = threading.Lock()
        self._path = path
        self._fd: int | None = None
        self._pid = -1

    def _file(self) -> int | None:
        if self._path is None:
            return None
        if self._fd is None or self._pid != os.getpid():  # a forked child opens its own
            try:
                self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                log.warning("no SQLite writer lock file %s (%s): busy timeout only",
                            self._path, exc)
                self._path = None
                return None
            self._pid = os.getpid()
        return self._fd

    def __enter__(self) -> None:
        self._thread_lock.acquire()
        try:
            fd = self._file()
            if fd is not None:
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            self._thread_lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            if self._fd is not None and self._pid == os.getpid():
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self._thread_lock.release()


_WRITE_LOCKS: dict[str, _SqliteWriteLock] = {}
_WRITE_LOCKS_GUARD = threading.Lock()


def _sqlite_write_lock(engine: sa.Engine) -> _SqliteWriteLock | None:
    """One writer lock per SQLite database in this process (None for other backends);
    file databases also share it with other processes (see ``_SqliteWriteLock``)."""
    if engine.dialect.name != "sqlite":
        return None
    key = str(engine.url)
    with _WRITE_LOCKS_GUARD:
        lock = _WRITE_LOCKS.get(key)
        if lock is None:
            database = engine.url.database or ""
            file_db = bool(database) and database != ":memory:" and not database.startswith(
                "file:") and "mode=memory" not in str(engine.url)
            path = str(Path(database).expanduser()) + "-wlock" if file_db else None
            lock = _WRITE_LOCKS[key] = _SqliteWriteLock(path)
        return lock


def private_sqlite_file(path: Path) -> None:
    """Make ``path`` (a SQLite database) readable by its owner only: its folder is created
    0700 if missing, the file is created 0600 before SQLite opens it (SQLite gives the
    ``-wal``/``-shm`` files it makes the database file's mode), and an existing file or
    side file that others may read is narrowed to 0600 (by path).

    An existing database file is never opened here: SQLite's locks are POSIX ``fcntl`` locks,
    which the kernel drops for the whole process when *any* descriptor of the file in it is
    closed. A second engine made in a process whose first engine holds connections (the
    service makes several) would silently drop their shared lock; another process closing
    its last connection then takes the file as unused, checkpoints and deletes the WAL while
    this process still writes to it, and readers elsewhere see a frozen database (or "disk
    I/O error"). See "How To Corrupt An SQLite Database File", section 2.2."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        os.close(os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        pass  # the mode check below, by path: no descriptor of the database file
    except OSError as exc:  # read-only media and the like: SQLite reports it on connect
        log.warning("could not create %s: %s", path, exc)
        return
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm"), Path(f"{path}-journal")):
        try:
            mode = p.stat().st_mode & 0o777
        except FileNotFoundError:
            continue
        if mode & 0o077:
            log.warning("%s was mode %o (readable by others); now 0600", p, mode)
            p.chmod(0o600)


def make_engine(
    url: str,
    *,
    busy_timeout_ms: int = 5000,
    pool_size: int = 10,
    max_overflow: int = 20,
    echo: bool = False,
    auto_checkpoint: bool = True,
) -> sa.Engine:
    """An engine for ``url``; SQLite files get their folder created, WAL and a busy timeout.

    ``auto_checkpoint=False``: this engine's commits never checkpoint the WAL (SQLite's
    default checkpoints in whichever commit crosses 1,000 pages, inside that writer's
    transaction, so every other writer waits on it); the owner runs a ``WalCheckpointer``."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return sa.create_engine(
            url, pool_size=pool_size, max_overflow=max_overflow, pool_pre_ping=True, echo=echo
        )
    database = parsed.database or ""
    if database and database != ":memory:" and not database.startswith("file:"):
        private_sqlite_file(Path(database).expanduser())
    engine = sa.create_engine(
        url,
        echo=echo,
        connect_args={"check_same_thread": False, "timeout": busy_timeout_ms / 1000},
        pool_size=pool_size,
        max_overflow=max_overflow,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA synchronous=NORMAL")
        if not auto_checkpoint:
            cursor.execute("PRAGMA wal_autocheckpoint=0")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: sa.Connection) -> None:
        mode = conn.get_execution_options().get(_BEGIN_OPTION, "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {mode}")

    return engine


class WalCheckpointer:
    """Checkpoints a SQLite database's WAL every ``interval_s`` on a thread of its own, off
    every request's and the control loop's path (for engines made with
    ``auto_checkpoint=False``). ``PASSIVE``: it copies what no reader still needs and
    takes no writer's turn, so writers go on while it runs; what readers still hold is
    copied on a later turn."""

    def __init__(self, engine: sa.Engine, interval_s: float) -> None:
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._engine = engine
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.checkpoints = 0

    def start(self) -> WalCheckpointer:
        if self._engine.dialect.name == "sqlite" and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="frenzy-wal-checkpoint",
                                            daemon=True)
            self._thread.start()
        return self

    def checkpoint(self) -> tuple[int, int, int]:
        """One passive checkpoint: (busy, WAL frames, frames checkpointed), as SQLite says."""
        conn = self._engine.raw_connection()
        try:
            busy, frames, done = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        finally:
            conn.close()
        self.checkpoints += 1
        return int(busy), int(frames), int(done)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.checkpoint()
            except Exception:  # a busy or closing database: the next turn tries again
                log.warning("WAL checkpoint failed", exc_info=True)

    def stop(self) -> None:
        """Stop the thread after one last checkpoint (what was written since is copied)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
            with contextlib.suppress(Exception):
                self.checkpoint()


def make_session_factory(engine: sa.Engine) -> sessionmaker[Session]:
    """Sessions that keep loaded objects usable after commit (responses are built after)."""
    return sessionmaker(engine, expire_on_commit=False, autoflush=False)


@contextmanager
def write_session(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session whose one transaction is meant to write; commits on success.

    On SQLite this process's writers first queue on one lock per file (see
    ``_sqlite_write_lock``) and the transaction starts with ``BEGIN IMMEDIATE``: a deferred
    transaction that reads and then writes fails at once if another writer committed in between (WAL
    snapshot), whereas an immediate one waits its turn on the busy timeout.
    """
    bind = factory.kw.get("bind")
    lock = _sqlite_write_lock(bind) if isinstance(bind, sa.Engine) else None
    with lock if lock is not None else contextlib.nullcontext(), factory() as session:
        session.connection(execution_options={_BEGIN_OPTION: "IMMEDIATE"})
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise


@contextmanager
def write_connection(engine: sa.Engine) -> Iterator[sa.Connection]:
    """A Core connection whose one transaction writes (``BEGIN IMMEDIATE`` and the writer
    lock on SQLite, as ``write_session``); commits on success. For hot paths that insert
    rows without the ORM's unit of work."""
    lock = _sqlite_write_lock(engine)
    with contextlib.ExitStack() as stack:
        if lock is not None:
            stack.enter_context(lock)
        conn = stack.enter_context(
            engine.connect().execution_options(**{_BEGIN_OPTION: "IMMEDIATE"}))
        with conn.begin():
            yield conn


def alembic_config(url: str | None = None, connection: sa.Connection | None = None) -> Config:
    """An Alembic ``Config`` for this project's migrations (URL or open connection)."""
    cfg = Config(str(ALEMBIC_INI)) if ALEMBIC_INI.exists() else Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["configure_logger"] = False
    if url is not None:
        cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def migrate(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (the only way the schema is made)."""
    from alembic import command

    log.info("migrating %s to %s", make_url(url).render_as_string(hide_password=True), revision)
    command.upgrade(alembic_config(url), revision)
