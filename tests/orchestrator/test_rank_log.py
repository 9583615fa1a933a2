"""The built-in trainer's rank log: a line per step with the loss the run returned, the
previous launch kept as rank-N.log.1, the traceback when it fails."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from orchestrator.trainer.loop import Control, RunConfig
from orchestrator.trainer.rank_log import step_line, train_logged
from predictor.spec import Family, ModelSpec

TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=128, max_seq_len=64)


def test_step_line_is_the_entrypoint_progress_format() -> None:
    assert step_line({"steps_done": 3, "loss": 2.5, "samples_per_s": 10.0, "lr": 1e-3}) == \
        "frenzy step=3 loss=2.500000 samples_per_s=10.00 lr=1.000e-03\n"


def test_each_step_is_in_the_rank_log_and_a_relaunch_rotates_it(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    cfg = RunConfig(job_id="logged", model=TINY, global_batch=4, seq_len=16, total_steps=2,
                    micro_batch=2, checkpoint_dir=str(tmp_path), checkpoint_every=100)
    result = train_logged(cfg, 0, Control())
    log = tmp_path / ".logs" / "logged" / "rank-0.log"
    steps = [ln for ln in log.read_text().splitlines() if ln.startswith("frenzy step=")]
    assert [ln.split()[1] for ln in steps] == ["step=1", "step=2"]
    assert [float(ln.split()[2].split("=")[1]) for ln in steps] == \
        pytest.approx(list(result.losses), abs=1e-6)
    assert log.stat().st_mode & 0o777 == 0o600
    with pytest.raises(ValueError, match="pipeline stage"):  # 3 stages of 2 layers
        train_logged(replace(cfg, pp=3), 0, Control())
    assert "exceeds num_layers" in log.read_text()  # the failure's traceback
    assert "frenzy step=2" in (log.parent / "rank-0.log.1").read_text()
