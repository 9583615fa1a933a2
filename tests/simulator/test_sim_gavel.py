"""Gavel's workload generator: its distributions, its draw order, seeding, and the spec."""

from __future__ import annotations

import collections
import itertools
import math
import statistics
from pathlib import Path

import pytest

from simulator.gavel import (
    JobType,
    duration_s,
    gavel_jobs,
    job_types,
    parse_spec,
    scale_factor,
)
from simulator.traces import TraceFormatError, traces_dir

TYPES = (JobType("X (batch size 8)", True), JobType("Y", False))


class Scripted:
    """An rng whose ``uniform`` / ``random`` return scripted fractions of their range."""

    def __init__(self, fractions: list[float]) -> None:
        self.fractions = list(fractions)

    def random(self) -> float:
        return self.fractions.pop(0)

    def uniform(self, a: float, b: float) -> float:
        return a + (b - a) * self.fractions.pop(0)


@pytest.mark.parametrize("u,gpus", [(0.0, 1), (0.69, 1), (0.75, 2), (0.9, 4), (0.96, 8)])
def test_gpu_count_bins(u: float, gpus: int) -> None:
    assert scale_factor(Scripted([u])) == gpus  # type: ignore[arg-type]


def test_duration_is_log_uniform_in_minutes() -> None:
    # random() 0.5 < 0.8: x = 1.5 + 1.5 * 0.5 = 2.25 -> 60 * 10**2.25 s
    assert duration_s(Scripted([0.5, 0.5])) == pytest.approx(60 * 177.827941)  # type: ignore
    # random() 0.9 >= 0.8: x = 3 + 0.0 -> 60 * 1000 s
    assert duration_s(Scripted([0.9, 0.0])) == pytest.approx(60_000.0)  # type: ignore


def test_jobs_follow_gavels_distributions() -> None:
    jobs = gavel_jobs(5000, 2.0, seed=7, types=TYPES)
    assert jobs[0].submit_time == 0.0 and jobs[0].name == "gavel-0"
    gaps = [b.submit_time - a.submit_time for a, b in itertools.pairwise(jobs)]
    assert min(gaps) >= 0 and statistics.mean(gaps) == pytest.approx(1800.0, rel=0.05)
    share = collections.Counter(j.num_gpus for j in jobs)
    for gpus, p in ((1, 0.70), (2, 0.10), (4, 0.15), (8, 0.05)):
        assert share[gpus] / len(jobs) == pytest.approx(p, abs=0.025)
    for j in jobs:  # 31.6 min .. 10**4 min per GPU, on the reference V100
        per_gpu = j.gpu_time_s / j.num_gpus
        assert 60 * 10**1.5 <= per_gpu <= 60 * 10**4
        if j.num_gpus > 1:  # only a type that runs distributed gets more than one GPU
            assert j.application == "x" and j.batch_size == 8
    long = sum(j.gpu_time_s / j.num_gpus >= 60_000 for j in jobs) / len(jobs)
    assert long == pytest.approx(0.2, abs=0.025)  # the x ~ U[3, 4] branch
    # log10(minutes) is uniform on [1.5, 3] in the other branch: its mean is 2.25
    short = [math.log10(j.gpu_time_s / j.num_gpus / 60) for j in jobs
             if j.gpu_time_s / j.num_gpus < 60_000]
    assert statistics.mean(short) == pytest.approx(2.25, abs=0.03)


def test_seeded_and_single_gpu_mode() -> None:
    a = gavel_jobs(30, 1.0, seed=3, types=TYPES)
    assert a == gavel_jobs(30, 1.0, seed=3, types=TYPES)
    assert a != gavel_jobs(30, 1.0, seed=4, types=TYPES)
    single = gavel_jobs(30, 1.0, seed=3, types=TYPES, multi_gpu=False)
    assert {j.num_gpus for j in single} == {1}
    # arrivals have their own generator; the GPU count is drawn (and discarded) before the
    # duration as Gavel does, so the first job's duration is the same
    assert [j.submit_time for j in single] == [j.submit_time for j in a]
    assert single[0].gpu_time_s == pytest.approx(a[0].gpu_time_s / a[0].num_gpus)
    with pytest.raises(ValueError, match="jobs_per_hour"):
        gavel_jobs(3, 0.0, types=TYPES)
    with pytest.raises(ValueError, match="more than one GPU"):
        gavel_jobs(3, 1.0, types=(JobType("Y", False),))


def test_spec() -> None:
    assert parse_spec("gavel-1") == (1.0, 0)
    assert parse_spec("gavel-0.5@3") == (0.5, 3)
    assert parse_spec("gavel-x") is None and parse_spec("sia-philly") is None


def test_job_types_read_from_a_throughput_table(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    p.write_text('{"v100": {"(\'A (batch size 4)\', 1)": {}, "(\'A (batch size 4)\', 2)": {},'
                 ' "(\'B\', 1)": {}}}')
    assert job_types(p) == (JobType("A (batch size 4)", True), JobType("B", False))
    p.write_text('{"v100": {"A": {}}}')
    with pytest.raises(TraceFormatError, match=r"key 'A' under 'v100'"):
        job_types(p)
    p.write_text('{"k80": {}}')
    with pytest.raises(TraceFormatError, match="no 'v100' worker type; has k80"):
        job_types(p)


@pytest.mark.skipif(not (traces_dir() / "gavel").exists(), reason="shared/traces/gavel absent")
def test_gavels_own_job_types_and_a_named_workload() -> None:
    types = job_types()
    assert len(types) == 26  # 5 ResNet-18, 4 ResNet-50, 5 Transformer, 5 LM, 5 Rec, A3C, GAN
    assert {t.family for t in types if not t.distributed} == {"recommendation", "a3c",
                                                             "cyclegan"}
    from simulator.replay import load_workloads

    ((label, mapped),) = load_workloads("gavel-2@1")
    assert label == "gavel-2@1" and len(mapped) == 150
    assert all(m.gpu_time_s == m.trace.gpu_time_s for m in mapped)
