"""``frenzy serve --workers N`` on Linux: N uvicorn worker processes, each listening on a
socket of its own bound with ``SO_REUSEPORT``, under a small supervisor.

uvicorn's own multi-process supervisor binds one socket and hands it to every worker: the
workers then race for each connection, and with libuv's (uvloop's) accept loop one worker
can take nearly every keep-alive client while the other idles (docs/api_load.md). With a
socket per worker in one ``SO_REUSEPORT`` group, the kernel picks the worker for each new
connection by a hash of its addresses and ports: the clients are spread over the workers
whatever the scheduling of the processes.

The supervising process (which also runs the Controller) holds one socket of the group
bound but not listening, so the port is taken (and resolved, for port 0) before any
worker starts, a port already in use is reported once, and no connection is queued on a
socket that nobody accepts from. A worker that dies is replaced; a worker that fails to
start (its app, or the bind) stops the whole set, as uvicorn does. ``SIGINT``/``SIGTERM``
stop the workers with ``SIGTERM`` (uvicorn's graceful shutdown: open requests finish) and
wait for them.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import socket
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.context import SpawnProcess
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

STARTUP_FAILURE = 3
"""The exit status of a uvicorn worker whose app (lifespan) failed to start
(``uvicorn.config.STARTUP_FAILURE``); also used here for a worker that could not bind."""
POLL_S = 0.5
"""How often the supervisor looks for dead workers."""
STOP_GRACE_S = 30.0
"""How long the workers get to finish their open requests after ``SIGTERM``."""


def reuse_port_available() -> bool:
    """True where ``SO_REUSEPORT`` spreads connections over the sockets sharing a port
    (Linux; elsewhere the option exists without the balancing, or not at all)."""
    return sys.platform.startswith("linux") and hasattr(socket, "SO_REUSEPORT")


def reuse_port_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` with ``SO_REUSEPORT`` (and ``SO_REUSEADDR``, as
    uvicorn's, for a restart over connections in ``TIME_WAIT``); not listening yet."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


def _worker(app: str, host: str, port: int, config: dict[str, Any]) -> None:
    """One worker process: its own socket in the port's group, then uvicorn until a signal
    (uvicorn's handlers: ``SIGTERM``/``SIGINT`` finish the open requests first)."""
    import uvicorn

    cfg = uvicorn.Config(app, host=host, port=port, **config)  # configures logging
    try:
        sock = reuse_port_socket(host, port)
    except OSError as exc:
        logging.getLogger("uvicorn.error").error("cannot bind %s:%d: %s", host, port, exc)
        sys.exit(STARTUP_FAILURE)
    with contextlib.suppress(KeyboardInterrupt):  # SIGINT re-raised after the shutdown
        uvicorn.Server(cfg).run(sockets=[sock])


@dataclass
class ReusePortWorkers:
    """``workers`` uvicorn processes serving ``app`` (an import string, e.g. a factory with
    ``factory=True`` in ``config``) on ``host:port``, one ``SO_REUSEPORT`` socket each.

    ``run()`` blocks until ``SIGINT``/``SIGTERM`` (or ``stop()`` from another thread), or
    until a worker fails to start; it returns 0, or 1 after a failed start."""

    app: str
    workers: int
    host: str
    port: int
    config: dict[str, Any] = field(default_factory=dict)
    """More ``uvicorn.Config`` keywords (log level, keep-alive timeout, ``factory``...)."""
    _procs: list[SpawnProcess] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _failed: bool = field(default=False, init=False)

    def stop(self) -> None:
        """Ask ``run()`` to stop the workers and return."""
        self._stop.set()

    @property
    def pids(self) -> list[int]:
        """The running workers' process ids (for tests and logs)."""
        return [p.pid for p in self._procs if p.pid is not None]

    def _start_one(self) -> SpawnProcess:
        proc = multiprocessing.get_context("spawn").Process(
            target=_worker, args=(self.app, self.host, self.port, self.config),
            name="frenzy-api-worker")
        proc.start()
        log.info("started API worker [%s] on %s:%d", proc.pid, self.host, self.port)
        return proc

    def _keep_alive(self) -> None:
        """Replace each worker that died; stop everything when one could not start."""
        for i, proc in enumerate(self._procs):
            if proc.is_alive() or self._stop.is_set():
                continue
            proc.join()
            if proc.exitcode == STARTUP_FAILURE:
                log.error("API worker [%s] failed to start; stopping", proc.pid)
                self._failed = True
                self._stop.set()
                return
            log.warning("API worker [%s] died (exit status %s); starting another",
                        proc.pid, proc.exitcode)
            self._procs[i] = self._start_one()

    def _terminate(self) -> None:
        for proc in self._procs:
            if proc.is_alive() and proc.pid is not None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in self._procs:
            proc.join(STOP_GRACE_S)
            if proc.is_alive():
                log.warning("API worker [%s] still running %.0f s after SIGTERM; killing",
                            proc.pid, STOP_GRACE_S)
                proc.kill()
                proc.join()

    def run(self) -> int:
        """Bind, start the workers, supervise them until told to stop, stop them."""
        try:
            holder = reuse_port_socket(self.host, self.port)
        except OSError as exc:
            log.error("cannot bind %s:%d: %s", self.host, self.port, exc)
            return 1
        self.port = holder.getsockname()[1]  # port 0: the one the kernel chose
        previous: dict[int, Callable[..., Any] | int | None] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            self._procs = [self._start_one() for _ in range(self.workers)]
            log.info("%d API workers on http://%s:%d, one SO_REUSEPORT socket each",
                     self.workers, self.host, self.port)
            while not self._stop.wait(POLL_S):
                self._keep_alive()
        finally:
            self._terminate()
            holder.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return 1 if self._failed else 0

    def _on_signal(self, sig: int, frame: FrameType | None) -> None:
        log.info("received %s: stopping the API workers", signal.Signals(sig).name)
        self._stop.set()


__all__ = ["ReusePortWorkers", "reuse_port_available", "reuse_port_socket"]
