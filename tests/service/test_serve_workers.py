"""``frenzy serve --workers 2``: the workers run with libuv's one-accept-per-wake-up switch.
They share one listening socket, and libuv otherwise accepts every pending connection on a
wake-up: in api_load trials one worker took 44-48 of 50 keep-alive clients in three of four
runs, and with the switch all seven runs split between 17/33 and 28/22. The switch does not
guarantee a split: a burst of 40 connections made from one thread right after start still
went 0-16 / 40-24 over six runs, so the test checks the switch reaches both workers and
that both serve, not the split (docs/api_load.md). Linux only (reads /proc)."""

from __future__ import annotations

import socket
import sys
import time
from pathlib import Path

import pytest
from serve_helpers import serve

from service.serve_cli import SINGLE_ACCEPT

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


def test_both_workers_listen_and_take_one_connection_per_wake_up(tmp_path: Path) -> None:
    s = serve(tmp_path, f"sqlite:///{tmp_path / 'frenzy.db'}", extra=["--workers", "2"])
    conns: list[socket.socket] = []
    try:
        # healthz answered by one worker; the burst waits until both have started
        deadline = time.monotonic() + 60
        while s.log_path.read_text(errors="replace").count(STARTED) < 2:
            assert time.monotonic() < deadline, s.log()
            time.sleep(0.2)
        port = int(s.url.rsplit(":", 1)[1])
        for _ in range(40):  # the burst: all connected before any request
            conns.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        for c in conns:
            c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        for c in conns:
            assert c.recv(64).startswith(b"HTTP/1.1 200")
        workers = [p for p in _children(s.proc.pid)  # not multiprocessing's resource tracker
                   if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        for p in workers:
            assert f"{SINGLE_ACCEPT}=1".encode() in Path(f"/proc/{p}/environ").read_bytes()
        assert len(workers) == 2, workers
        listening = _tcp_on(port, "0A")
        assert all(_socket_inodes(p) & listening for p in workers)  # both can accept
        held = _tcp_on(port, "01")
        assert sum(len(_socket_inodes(p) & held) for p in workers) == 40  # all 40 served
    finally:
        for c in conns:
            c.close()
        s.stop()
