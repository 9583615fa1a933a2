"""The declared tuning / validation split and the validation benchmark's quick run."""

from __future__ import annotations

import argparse
import json

import pytest

from benchmarks import validation
from benchmarks.splits import TUNING, VALIDATION
from simulator.traces import TRACE_SETS, traces_dir


def test_the_split_is_disjoint_and_covers_every_named_set() -> None:
    assert not set(TUNING) & set(VALIDATION)
    # every named trace set is in exactly one split; the NewWorkload queues are tuning
    assert set(TRACE_SETS) <= set(TUNING) | set(VALIDATION)
    assert {"sia-philly", "sia-saturn", "newworkload-30", "newworkload-60"} == set(TUNING)
    assert "elasticflow" in VALIDATION and "pollux" in VALIDATION


def test_a_has_variant_is_a_name_and_json_keyword_arguments() -> None:
    assert validation._variant('before={"widen_gain": null}') == ("before",
                                                                 {"widen_gain": None})
    for bad in ("before", "sia={}", "2x={}", "v=[1]", "v={oops"):
        with pytest.raises(argparse.ArgumentTypeError):
            validation._variant(bad)


@pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")
def test_the_tuning_split_replays_every_file_of_each_set() -> None:
    got = validation.workloads_of("tuning", ("sia-philly", "newworkload-30"))
    # Sia's philly set holds 8 workload files; a NewWorkload queue is one
    assert [w for w, _, _ in got] == [f"sia-philly:{k}" for k in range(1, 9)] + [
        "newworkload-30"]
    assert got[2] == ("sia-philly:3", "sia-philly", 2)
    assert validation.workloads_of("validation", ("sia-rate_10",)) == [
        ("sia-rate_10:1", "sia-rate_10:1", 0)]


def test_margin_is_one_minus_the_ratio() -> None:
    assert validation.margin_pct(3000.0, 4000.0) == pytest.approx(25.0)  # has 25 % faster
    assert validation.margin_pct(4400.0, 4000.0) == pytest.approx(-10.0)  # has 10 % slower


@pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")
def test_quick_run_reports_the_headline_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert validation.main(["--quick", "--json", "--workers", "1"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["policy_crashes"] == 0
    for cl in validation.CLUSTERS:
        res = out["clusters"][cl]
        assert len(res["workloads"]) == len(validation.QUICK_SETS)
        for key in ("has_vs_sia_median_pct", "has_vs_sia_min_pct", "has_vs_sia_max_pct",
                    "has_vs_opportunistic_median_pct", "workloads_has_worse_than_sia_by_5pct"):
            assert key in res
        for row in res["workloads"]:  # the margin is the one the row's JCTs give
            assert row["has_vs_sia_pct"] == pytest.approx(
                100 * (1 - row["has_avg_jct_s"] / row["sia_avg_jct_s"]), abs=1e-3)
            # no policy ends its jobs sooner on average than the bound
            for p in validation.POLICIES:
                assert row["bound_avg_jct_s"] <= row[f"{p}_avg_jct_s"] + 1e-3
            assert row["bound_vs_sia_pct"] == pytest.approx(
                100 * (1 - row["bound_avg_jct_s"] / row["sia_avg_jct_s"]), abs=1e-3)
