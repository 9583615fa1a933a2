"""The driver loop: one thread that owns the Controller and delivers the backend's events.

The Controller is not thread-safe, so everything that touches it — submissions and
cancellations from the API, the backend's events (``backend.poll``), periodic scheduling
ticks, inventory refreshes (nodes joining or leaving) — runs on the pump's thread. Other
threads hand it work with ``call`` (or ``submit`` / ``cancel``) and get a ``Future``.
``step`` runs one iteration inline, for callers that drive the loop themselves.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

from orchestrator.controller import Controller
from scheduler.cluster import ClusterState
from scheduler.job import JobView

log = logging.getLogger(__name__)
T = TypeVar("T")


class PolledBackend(Protocol):
    """What the pump needs of a backend besides the ``Backend`` protocol."""

    def poll(self) -> None: ...

    def inventory(self) -> ClusterState: ...


class Pump:
    """Runs ``controller`` and ``backend`` on one thread; see the module docstring."""

    def __init__(
        self,
        controller: Controller,
        backend: PolledBackend,
        *,
        poll_interval_s: float = 0.05,
        tick_interval_s: float = 1.0,
        inventory_interval_s: float | None = 2.0,
    ) -> None:
        self.controller = controller
        self.backend = backend
        self.poll_interval_s = poll_interval_s
        self.tick_interval_s = tick_interval_s
        self.inventory_interval_s = inventory_interval_s
        self._commands: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_tick = self._last_inventory = time.monotonic()

    # -- thread ----------------------------------------------------------------------------
    def start(self) -> Pump:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="frenzy-pump", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None

    def __enter__(self) -> Pump:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # keep the loop alive; the error is logged
                log.exception("pump iteration failed")
            self._stop.wait(self.poll_interval_s)

    # -- work ------------------------------------------------------------------------------
    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run ``fn()`` on the pump thread (inline when already on it, or not started)."""
        fut: Future[T] = Future()
        if self._thread is None or threading.current_thread() is self._thread:
            _run(fn, fut)
        else:
            self._commands.put((fn, fut))
        return fut

    def submit(self, job: JobView) -> Future[None]:
        return self.call(lambda: self.controller.submit(job))

    def cancel(self, job_id: str, reason: str = "cancelled by user") -> Future[None]:
        return self.call(lambda: self.controller.cancel(job_id, reason))

    def step(self) -> None:
        """One iteration: queued commands, backend events, a tick and an inventory refresh
        when due."""
        while True:
            try:
                fn, fut = self._commands.get_nowait()
            except queue.Empty:
                break
            _run(fn, fut)
        self.backend.poll()
        now = time.monotonic()
        if self.inventory_interval_s is not None and \
                now - self._last_inventory >= self.inventory_interval_s:
            self._last_inventory = now
            self.controller.sync_nodes(self.backend.inventory().nodes)
        if now - self._last_tick >= self.tick_interval_s:
            self._last_tick = now
            self.controller.tick()

    def wait_until(self, pred: Callable[[Controller], bool], timeout_s: float) -> bool:
        """Wait until ``pred(controller)`` holds (evaluated on the pump thread)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._thread is None:
                self.step()
                if pred(self.controller):
                    return True
                time.sleep(self.poll_interval_s)
            elif self.call(lambda: pred(self.controller)).result(timeout=30):
                return True
            else:
                time.sleep(self.poll_interval_s)
        return False


def _run(fn: Callable[[], Any], fut: Future[Any]) -> None:
    try:
        fut.set_result(fn())
    except BaseException as e:
        fut.set_exception(e)
