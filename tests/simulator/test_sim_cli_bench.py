"""``frenzy simulate`` (called directly) and the quick benchmark runs: output and JSON keys."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from simulator.cli import add_simulate_parser, run_simulate
from simulator.traces import traces_dir

DATA = Path(__file__).parent / "data"


def parse(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="frenzy")
    add_simulate_parser(ap.add_subparsers(dest="cmd"))
    return ap.parse_args(["simulate", *argv])


def test_simulate_prints_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["--cluster", "config/phoebe.yaml", "--trace", str(DATA / "golden_trace.csv"),
                  "--policy", "has,opportunistic", "--max-jobs", "12", "--json",
                  "--no-progress"])
    assert run_simulate(args) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert "avg JCT" in out[1] and "unfin" in out[1] and "restarts/job" in out[1]
    data = json.loads(out[-1])
    res = data["results"][str(DATA / "golden_trace.csv")]
    assert set(res) == {"has", "opportunistic"}
    for r in res.values():
        assert r["jobs"] == 12 and r["finished"] == 12 and r["unfinished"] == 0
        assert {"avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "gpu_util",
                "avg_samples_per_s", "sched_p50_ms", "sched_p95_ms", "sched_max_ms",
                "restarts_per_job"} <= set(r)
    assert res["opportunistic"]["restarts_per_job"] == 0.0  # it never stops or resizes


def test_simulate_reports_bad_input(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_simulate(parse(["--trace", "nope", "--no-progress"])) == 2
    assert "known sets" in capsys.readouterr().err
    assert run_simulate(parse(["--trace", str(DATA / "golden_trace.csv"), "--policy", "zzz",
                               "--no-progress"])) == 2
    assert "unknown policy zzz" in capsys.readouterr().err


def test_simulate_reports_a_policy_crash_as_internal_error(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A ValueError raised while replaying (issue 14: the booking profile's rounding crash)
    is a fault of the simulator, not bad input: exit status 1, and the message says so."""
    def boom(*a: object, **k: object) -> None:
        raise ValueError("reservation exceeds A100-40G capacity at 38331.50305265253")

    monkeypatch.setattr("simulator.cli.run_tasks", boom)
    args = parse(["--trace", str(DATA / "golden_trace.csv"), "--policy", "elastic",
                  "--no-progress"])
    assert run_simulate(args) == 1
    err = capsys.readouterr().err
    assert "internal error (not a problem with your input)" in err
    assert "ValueError: reservation exceeds" in err


needs_traces = pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")


@needs_traces
def test_jct_quick_json_keys(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from benchmarks import jct

    assert jct.main(["--quick", "--json", "--workers", "1", "--docs", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for spec in jct.QUICK_SETS:
        res = data["results"][spec]
        for pol in jct.POLICIES:
            assert {"avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s"} <= set(res[pol])
        assert {"jct_reduction_vs_opportunistic", "jct_reduction_vs_sia"} <= set(res["has"])
    assert (tmp_path / "jct_cdf.png").stat().st_size > 0 and (tmp_path / "jct.md").exists()


@needs_traces
def test_sched_overhead_quick_json_keys(capsys: pytest.CaptureFixture[str],
                                        tmp_path: Path) -> None:
    from benchmarks import sched_overhead

    assert sched_overhead.main(["--quick", "--json", "--calls", "3", "--window", "1",
                                "--docs", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {"has_p50_ms", "has_p95_ms", "sia_p50_ms", "sia_p95_ms", "speedup"} <= set(data)
    assert data["largest_gpus"] == 128
    assert (tmp_path / "sched_overhead.png").stat().st_size > 0


def test_simulate_error_modes_move_the_jct_and_none_is_the_default(
        capsys: pytest.CaptureFixture[str]) -> None:
    base = ["--cluster", "config/phoebe.yaml", "--trace", str(DATA / "golden_trace.csv"),
            "--policy", "opportunistic", "--max-jobs", "6", "--json", "--no-progress"]
    jct: dict[str, float] = {}
    for mode in ("default", "none", "measured", "2x"):
        assert run_simulate(parse(base if mode == "default" else [*base, "--error", mode])) == 0
        data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert ("error" in data) is (mode in ("measured", "2x"))
        jct[mode] = data["results"][str(DATA / "golden_trace.csv")]["opportunistic"]["avg_jct_s"]
    assert jct["default"] == jct["none"]
    assert jct["measured"] != jct["none"] and jct["2x"] != jct["measured"]
    # the policies plan on corrected step times under error unless told not to
    assert run_simulate(parse([*base, "--error", "2x", "--no-correction"])) == 0
    data = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert data["correct"] is False and data["error"] == "2x"
    with pytest.raises(SystemExit):
        parse([*base, "--error", "3x"])
    assert "invalid choice: '3x'" in capsys.readouterr().err
