"""The README's bring-your-own-script example (``examples/byo/train.py``) honours the
entrypoint protocol when run as a worker runs it (``run_entrypoint``, with the example's
folder as the job's working directory): progress lines reach the controller, checkpoints
land in ``FRENZY_CHECKPOINT_DIR``, the weights in ``FRENZY_EXPORT_DIR``, the stop file stops
it at a saved step and a relaunch resumes from there.

The example needs torch, which the job uid's interpreter (the system ``python3``) may lack,
so it runs uncontained here (the worker's own uid: ``can_switch_user`` patched off); the
contained path with a working directory is tested over Ray in ``test_ray_backend.py``."""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from orchestrator import sandbox
from orchestrator.trainer.entrypoint import EXPORT_DIR, run_entrypoint
from orchestrator.trainer.loop import Control, RunConfig

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "byo"


@pytest.fixture(autouse=True)
def uncontained(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "can_switch_user", lambda: False)


def _cfg(tmp_path: Path, steps: int, resume: int = 0, **env: str) -> RunConfig:
    return RunConfig(job_id="byo", model=None, global_batch=64, seq_len=0, total_steps=steps,
                     checkpoint_dir=str(tmp_path), entrypoint=(sys.executable, "train.py"),
                     working_dir=str(EXAMPLE),
                     env={"FRENZY_RESUME_STEP": str(resume), **env})


def _recording() -> tuple[Control, list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []
    control = Control()
    control.on_step = seen.append
    return control, seen


def test_the_example_trains_reports_checkpoints_and_exports(tmp_path: Path) -> None:
    control, seen = _recording()
    result = run_entrypoint(_cfg(tmp_path, 40, SAVE_EVERY="10"), 0, control)
    assert result.finished and not result.stopped and result.steps_done == 40
    reported = [s["steps_done"] for s in seen[1:]]  # seen[0]: the launch (resume step 0)
    assert reported == [10, 20, 30, 40]  # one line per saved step
    losses = [s["loss"] for s in seen[1:]]
    assert losses[-1] < losses[0] / 2, losses  # it learns y = 3x - 1
    ckdir = tmp_path / "byo"
    assert sorted(p.name for p in ckdir.glob("step-*.pt")) == [
        "step-10.pt", "step-20.pt", "step-30.pt", "step-40.pt"]
    from safetensors.torch import load_file

    weights = load_file(ckdir / EXPORT_DIR / "model.safetensors")
    saved = torch.load(ckdir / "step-40.pt", weights_only=True)["model"]
    assert weights.keys() == saved.keys()
    assert all(torch.equal(weights[k], saved[k]) for k in weights)
    assert (ckdir / "train.py").exists() is False  # the code stays in the run folder


def test_the_stop_file_stops_it_at_a_saved_step_and_a_relaunch_resumes(
        tmp_path: Path) -> None:
    control, seen = _recording()
    reported = threading.Event()

    def on_step(status: dict[str, Any]) -> None:
        seen.append(status)
        if status["steps_done"] >= 2:
            reported.set()
            control.stop.set()  # what the controller's stop() does

    control.on_step = on_step
    cfg = _cfg(tmp_path, 100_000, SAVE_EVERY="1", STEP_SLEEP_S="0.01")
    result = run_entrypoint(cfg, 0, control)
    assert reported.is_set()
    assert result.stopped and not result.finished
    stopped_at = result.checkpoint_step
    assert 2 <= stopped_at < 100_000
    assert (tmp_path / "byo" / f"step-{stopped_at}.pt").exists()
    assert not (tmp_path / "byo" / EXPORT_DIR).exists()  # no export before the end

    control2, seen2 = _recording()
    total = stopped_at + 3
    again = run_entrypoint(_cfg(tmp_path, total, resume=stopped_at, SAVE_EVERY="1"), 0,
                           control2)
    assert again.finished and again.first_step == stopped_at
    assert [s["steps_done"] for s in seen2] == [stopped_at, stopped_at + 1, stopped_at + 2,
                                                total]
    assert (tmp_path / "byo" / EXPORT_DIR / "model.safetensors").exists()
