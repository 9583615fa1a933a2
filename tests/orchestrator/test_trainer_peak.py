"""The built-in trainer measures its own peak memory (the CPU storage tracker here) and
enforces an emulated GPU's capacity as a cap, failing the way CUDA does."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from orchestrator.trainer.loop import Control, RunConfig, train
from orchestrator.trainer.memory import RankOutOfMemory
from predictor.memory import estimate_memory
from predictor.runtimes import FRENZY_CPU
from predictor.spec import Family, ModelSpec, ParallelConfig, Precision, TrainingSpec

TINY = ModelSpec("tiny-gpt2", Family.GPT2, num_layers=2, hidden_size=64, num_heads=4,
                 vocab_size=256, max_seq_len=32)


def _cfg(tmp: Path, **kw: object) -> RunConfig:
    base = {"job_id": "j", "model": TINY, "global_batch": 8, "seq_len": 32, "total_steps": 3,
            "micro_batch": 2, "precision": Precision.BF16, "checkpoint_dir": str(tmp)}
    return RunConfig(**{**base, **kw})  # type: ignore[arg-type]


def test_the_measured_peak_is_reported_and_matches_the_frenzy_prediction(tmp_path: Path) -> None:
    control = Control()
    result = train(_cfg(tmp_path), 0, control)
    predicted = estimate_memory(
        TINY, TrainingSpec(global_batch=8, seq_len=32, steps=3, precision=Precision.BF16),
        ParallelConfig(micro_batch=2), None, runtime=FRENZY_CPU).tensors
    assert result.peak_tensors_bytes is not None and result.peak_reserved_bytes is None
    # the real trainer's tensor peak, counted storage by storage, vs the predictor
    assert abs(result.peak_tensors_bytes - predicted) / predicted < 0.02
    assert control.status["peak_tensors_bytes"] == result.peak_tensors_bytes
    assert control.status["peak_source"] == "cpu-tracker"


def test_a_cap_below_the_peak_fails_like_a_cuda_oom(tmp_path: Path) -> None:
    peak = train(_cfg(tmp_path / "a"), 0).peak_tensors_bytes
    assert peak is not None
    cap = peak * 9 // 10
    with pytest.raises(torch_oom()) as info:
        train(_cfg(tmp_path / "b", memory_cap_bytes=cap), 0)
    err = info.value
    assert isinstance(err, RankOutOfMemory)
    assert cap < err.held_bytes <= peak and err.cap_bytes == cap
    again = pickle.loads(pickle.dumps(err))  # crosses Ray as a pickled task error
    assert (again.held_bytes, again.cap_bytes) == (err.held_bytes, cap)
    # a cap at the peak is enough
    assert train(_cfg(tmp_path / "c", memory_cap_bytes=peak), 0).finished


def torch_oom() -> type[BaseException]:
    import torch

    return torch.OutOfMemoryError
