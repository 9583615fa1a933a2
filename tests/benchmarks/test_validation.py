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


def test_alibaba_openb_is_validation_and_its_quick_form_is_its_first_window() -> None:
    from benchmarks.splits import first_files

    assert "alibaba-openb" in VALIDATION and "alibaba-openb" not in TUNING
    # a windowed set's first workload is its first window; an explicit <set>:<k> stays
    assert first_files(("alibaba-openb", "alibaba-openb:7")) == ("alibaba-openb:1",
                                                                 "alibaba-openb:7")


@pytest.mark.skipif(not (traces_dir() / "alibaba-gpu-v2023").exists(),
                    reason="shared/traces/alibaba-gpu-v2023 not present")
def test_sets_replaces_the_splits_sets(capsys: pytest.CaptureFixture[str]) -> None:
    assert validation.main(["--sets", "alibaba-openb:2,alibaba-openb:5", "--max-jobs", "4",
                            "--clusters", "phoebe", "--workers", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rows = out["clusters"]["phoebe"]["workloads"]
    assert [r["workload"] for r in rows] == ["alibaba-openb:2", "alibaba-openb:5"]
    assert out["max_jobs"] == 4 and out["policy_crashes"] == 0
    with pytest.raises(SystemExit):
        validation.main(["--sets", ",", "--json"])


def test_gavels_generated_workloads_are_validation() -> None:
    from benchmarks.splits import first_files

    assert {"gavel-1", "gavel-2"} <= set(VALIDATION)
    assert first_files(("gavel-1", "gavel-2@3")) == ("gavel-1", "gavel-2@3")


@pytest.mark.skipif(not (traces_dir() / "alibaba-gpu-v2023").exists(),
                    reason="shared/traces/alibaba-gpu-v2023 not present")
def test_alibaba_windows_are_split_even_to_tuning_odd_to_validation() -> None:
    from benchmarks.splits import first_files, tuning_workloads, validation_windows

    tuning = [w for w in tuning_workloads() if w.startswith("alibaba-openb:")]
    valid = validation_windows("alibaba-openb")
    assert tuning == [f"alibaba-openb:{k}" for k in (2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24)]
    assert valid == tuple(f"alibaba-openb:{k}" for k in range(1, 24, 2))
    # every window in exactly one split; the quick validation form is a validation window
    assert not set(tuning) & set(valid) and len(tuning) + len(valid) == 24
    assert first_files(("alibaba-openb",))[0] in valid
    assert set(TUNING) <= set(tuning_workloads())
