"""``frenzy serve --workers 2`` on Linux: each worker listens on a socket of its own in one
``SO_REUSEPORT`` group (``service.serve_workers``), so the kernel spreads connections over
the workers by a hash of their addresses. With one shared socket, libuv's accept loop let
one worker take 44-48 of 50 keep-alive clients in three of four api_load runs, and even
with one accept per wake-up a 40-connection burst from one thread went 0/40 once in six
(docs/api_load.md). Linux only (reads /proc)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from serve_helpers import free_port, serve

from service.serve_workers import ReusePortWorkers, reuse_port_socket

STARTED = "Application startup complete"
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _workers(pid: int) -> list[int]:
    """The uvicorn workers among ``pid``'s children (not multiprocessing's tracker); a child
    that exits while it is being read (a dying worker) is not one."""
    out = []
    for p in _children(pid):
        try:
            cmdline = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            out.append(p)
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = fd.readlink().as_posix()
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def _tcp_on(port: int, state: str) -> set[int]:
    """Inodes of TCP sockets on local ``port`` in ``state`` (01 established, 0A listening)."""
    out = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        cols = line.split()
        if cols[3] == state and int(cols[1].split(":")[1], 16) == port:
            out.add(int(cols[9]))
    return out


def _wait(pred: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def test_each_worker_listens_on_its_own_socket_and_both_get_connections(
        tmp_path: Path) -> None:
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}", extra=["--workers", "2"])
    conns: list[socket.socket] = []
    try:
        _wait(lambda: s.log_path.read_text(errors="replace").count(STARTED) >= 2, 60,
              "both workers started")
        port = int(s.url.rsplit(":", 1)[1])
        workers = _workers(s.proc.pid)
        assert len(workers) == 2, workers
        listening = _tcp_on(port, "0A")
        own = [_socket_inodes(p) & listening for p in workers]
        # one listening socket each, not one shared: two sockets, disjoint
        assert [len(o) for o in own] == [1, 1] and own[0] != own[1], own
        assert not _socket_inodes(s.proc.pid) & listening  # the supervisor only holds the port
        for _ in range(40):  # the burst from one thread: all connected before any request
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for c in conns:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for c in conns:
            assert c.recv(64).startswith(b"HTTP/1.1 200")
        held = _tcp_on(port, "01")
        per_worker = [len(_socket_inodes(p) & held) for p in workers]
        # 40 source ports hashed over two sockets: all served, each worker some
        # (P(one gets none) = 2 * 2**-40)
        assert sum(per_worker) == 40 and min(per_worker) > 0, per_worker
    finally:
        for c in conns:
            c.close()
        s.stop()
    assert s.proc.returncode == 0, s.log()
    assert not _workers(s.proc.pid)


def test_a_worker_that_dies_is_replaced(tmp_path: Path) -> None:
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}", extra=["--workers", "2"])
    try:
        _wait(lambda: len(_workers(s.proc.pid)) == 2, 60, "two workers")
        victim = _workers(s.proc.pid)[0]
        os.kill(victim, signal.SIGKILL)
        port = int(s.url.rsplit(":", 1)[1])

        def replaced() -> bool:
            ws = _workers(s.proc.pid)
            listening = _tcp_on(port, "0A")
            return (len(ws) == 2 and victim not in ws
                    and all(_socket_inodes(p) & listening for p in ws))

        _wait(replaced, 60, f"a new worker listening; log:\n{s.log()}")
        assert s.client.get("/healthz").status_code == 200
    finally:
        s.stop()
    assert s.proc.returncode == 0, s.log()


def test_a_taken_port_is_reported_once() -> None:
    port = free_port()
    with socket.socket() as taken:  # no SO_REUSEPORT: the group cannot join it
        taken.bind(("127.0.0.1", port))
        taken.listen()
        sup = ReusePortWorkers("service.serve_cli:worker_app", 2, "127.0.0.1", port)
        assert sup.run() == 1
        assert sup.pids == []


def test_reuse_port_sockets_share_a_port() -> None:
    a = reuse_port_socket("127.0.0.1", 0)
    try:
        b = reuse_port_socket("127.0.0.1", a.getsockname()[1])
        assert b.getsockname() == a.getsockname()
        for s in (a, b):
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        b.close()
    finally:
        a.close()


def test_worker_app_freezes_its_heap_and_shortens_the_gil_switch_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    from service.db.engine import migrate
    from service.serve_cli import WORKER_SWITCH_INTERVAL_S, worker_app

    url = f"sqlite:///{tmp_path / 'frenzy.db'}"
    migrate(url)
    monkeypatch.setenv("DATABASE_URL", url)
    monkeypatch.setenv("FRENZY_HOME", str(tmp_path / "home"))
    before = sys.getswitchinterval()
    try:
        worker_app()
        assert sys.getswitchinterval() == pytest.approx(0.001) == WORKER_SWITCH_INTERVAL_S
        assert gc.get_freeze_count() > 0
    finally:
        sys.setswitchinterval(before)
        gc.unfreeze()
