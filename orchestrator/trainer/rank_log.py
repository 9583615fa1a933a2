"""The built-in trainer's output kept like an entrypoint's: one log per rank and launch.

``<checkpoint_dir>/.logs/<job_id>/rank-<R>.log`` (the folder ``orchestrator.sandbox`` uses for
entrypoints, service-owned, ``0700``; the file ``0600``, at most ``LOG_LIMIT_BYTES``, the
previous launch's kept as ``rank-<R>.log.1``) gets a line per step (step, loss, samples/s,
learning rate) and the trainer's own log records from the training thread, and the
traceback if the run fails, so ``frenzy logs`` shows a built-in job as it shows a script.
"""

from __future__ import annotations

import logging
import threading
import traceback
from typing import Any

from orchestrator import sandbox
from orchestrator.trainer.loop import Control, RunConfig, RunResult, train


class _ThreadHandler(logging.Handler):
    """Writes the records of one thread (the training thread) to the rank's log."""

    def __init__(self, out: Any, thread_id: int) -> None:
        super().__init__(logging.INFO)
        self._out, self._thread = out, thread_id
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self._thread:
            self._out.write(self.format(record) + "\n")


def step_line(status: dict[str, Any]) -> str:
    """One step's line, in the entrypoint progress format (``frenzy step=N loss=x ...``)."""
    parts = [f"frenzy step={status.get('steps_done')}"]
    for key, fmt in (("loss", ".6f"), ("samples_per_s", ".2f"), ("lr", ".3e")):
        value = status.get(key)
        if isinstance(value, int | float):
            parts.append(f"{key}={value:{fmt}}")
    return " ".join(parts) + "\n"


def train_logged(cfg: RunConfig, rank: int, control: Control) -> RunResult:
    """``train`` with its output in the rank's log (see the module docstring)."""
    root = cfg.checkpoint_dir
    sandbox.check_job_id(cfg.job_id)
    logs = sandbox.private_log_dir(root, cfg.job_id)
    box_log = logs / f"rank-{rank}.log"
    with sandbox.open_rank_log(box_log) as out:
        previous = control.on_step

        def on_step(status: dict[str, Any]) -> None:
            if status.get("loss") is not None:
                out.write(step_line(status))
            if previous is not None:
                previous(status)

        handler = _ThreadHandler(out, threading.get_ident())
        target = logging.getLogger("orchestrator")
        target.addHandler(handler)
        control.on_step = on_step
        try:
            return train(cfg, rank, control)
        except BaseException:
            out.write(traceback.format_exc())
            raise
        finally:
            control.on_step = previous
            target.removeHandler(handler)
