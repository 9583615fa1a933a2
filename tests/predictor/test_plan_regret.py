"""The plan-choice benchmark's bookkeeping: stage splits read from AMP, regret, OOM counts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

import benchmarks.plan_regret as pr
from predictor.gpus import load_gpu_catalog
from predictor.spec import ParallelConfig, TrainingSpec
from predictor.step_time import Topology
from predictor.validation import AMP_MODEL, amp_stage_layers

SHARED = Path(__file__).resolve().parents[2].parent / "shared"


def test_amp_partitions_count_transformer_layers_per_stage() -> None:
    # AMP's profile has the 24 transformer layers at pipeline indices 2..25 of 30
    assert amp_stage_layers("0,30") == (24,)
    assert amp_stage_layers("0,8,14,20,30") == (6, 6, 6, 6)
    assert amp_stage_layers("0,15,30") == (13, 11)
    p16 = amp_stage_layers("0,4,6,8,10,12,14,16,17,18,19,20,21,22,23,25,30")
    assert p16[0] == 2 and p16[-1] == 1 and sum(p16) == 24 and len(p16) == 16


def _run(label_dp: int, measured: float | None) -> pr.Run:
    train = TrainingSpec(global_batch=8, seq_len=1024)
    par = ParallelConfig(dp=label_dp, tp=4 // label_dp, micro_batch=1)
    return pr.Run("t", ("k",), AMP_MODEL, train, par, "T4", Topology(), "deepspeed", measured)


def test_regret_and_memory_mistakes_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    runs = [_run(1, 1.0), _run(2, 1.2), _run(4, None)]  # dp=4 ran out of memory
    predicted = {1: 3.0, 2: 2.0, 4: 1.0}  # the model prefers dp=4, then dp=2
    monkeypatch.setattr(pr, "predicted_s", lambda run, gpu: predicted[run.par.dp])
    # the memory model accepts the OOM run (dp=4) and rejects the run that ran (dp=1)
    monkeypatch.setattr(pr, "memory_fits", lambda run, gpu, margin=0.13: run.par.dp != 1)
    decisions, oom_accepted, ran_rejected = pr.decide(runs, load_gpu_catalog())
    assert [r.par.dp for r in oom_accepted] == [4] and [r.par.dp for r in ran_rejected] == [1]
    (d,) = decisions
    assert d.best == "t4d1p1 mb1" and d.chosen == "t1d4p1 mb1" and math.isinf(d.regret)
    # baseline: the most data parallelism the memory model accepts -> dp=4 (it OOMs)
    assert math.isinf(d.baseline_regret)
    monkeypatch.setattr(pr, "memory_fits", lambda run, gpu, margin=0.13: run.par.dp != 4)
    (d,) = pr.decide(runs, load_gpu_catalog())[0]
    assert d.chosen == "t2d2p1 mb1" and d.regret == pytest.approx(0.2)
    s = pr.summarize([d])
    assert s["share_within_5pct"] == 0.0 and s["p90_regret"] == pytest.approx(0.2)


def _row(mb: int, partition: str, ran: bool, experiment: str = "homogeneous") -> dict:
    return {"experiment": experiment, "tp": "1", "dp": "1", "pp": "2", "micro_batch": str(mb),
            "layer_partition": partition, "measured_iter_time_s": "1.0" if ran else "",
            "oom_or_failed": "" if ran else "1"}


def test_failures_that_cannot_be_memory_are_recognised() -> None:
    rows = [
        _row(1, "0,15,30", ran=False),  # mb 2 of the same plan ran: not memory
        _row(2, "0,15,30", ran=True),
        _row(4, "0,15,30", ran=False),  # larger than any that ran: may be memory
        _row(1, "0,14,30", ran=False),  # another partition: a different plan
        _row(1, "0,15,30", ran=False, experiment="het_cluster"),  # another experiment
        _row(8, "0,1,2,30", ran=False),  # stage 1 = pseudo-layer 1 only: no parameters
    ]
    assert pr.not_memory_failures(rows) == {0, 5}


def test_p90_is_nearest_rank() -> None:
    assert pr.p90([0.0] * 9 + [1.0]) == 0.0
    assert pr.p90([0.0] * 8 + [0.5, 1.0]) == 0.5


@pytest.mark.skipif(not (SHARED / "measurements" / "vtrain").exists(),
                    reason="../shared measurements absent")
def test_measured_decisions_stay_within_reported_figures() -> None:
    runs, _ = pr.load_runs()
    decisions, _, ran_rejected = pr.decide(runs, load_gpu_catalog())
    s = pr.summarize(decisions)
    # docs/plan_regret.md: 149 decisions, 82.5 % within 5 %, p90 16.0 %; 0 ran but rejected
    assert s["decisions"] == 149
    assert s["share_within_5pct"] >= 0.8
    assert s["share_within_5pct"] > s["baseline_share_within_5pct"]
    assert ran_rejected == []


def test_cell_oracle_rescales_each_cell_by_its_median_ratio(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # one decision, two cells (dp 1 / dp 2): the model ranks dp=2 first (1.0 < 2.0) but it
    # ran slower (1.5 > 1.0): regret 50 %. Scaled by each cell's measured/predicted ratio
    # (0.5 and 1.5) the predictions become the measurements, so the oracle picks dp=1.
    runs = [_run(1, 1.0), _run(2, 1.5)]
    predicted = {1: 2.0, 2: 1.0}
    monkeypatch.setattr(pr, "predicted_s", lambda run, gpu: predicted[run.par.dp])
    (d,) = pr.decide(runs, load_gpu_catalog())[0]
    assert d.regret == pytest.approx(0.5)
    share = pr.cell_oracle_share(runs, load_gpu_catalog(), lambda r: (r.par.dp,))
    assert share == 1.0
    # one cell for both: a common factor cannot change the ranking
    assert pr.cell_oracle_share(runs, load_gpu_catalog(), lambda r: ()) == 0.0
