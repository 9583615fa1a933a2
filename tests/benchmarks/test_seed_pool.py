"""benchmarks.seed_pool: margins pooled over error seeds, worked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import seed_pool


def _run(seed: int, rows: list[tuple[str, float, float, float]]) -> dict:
    """A validation --json output with one cluster; rows: (workload, has, sia, opp) JCT s."""
    ws = [{"workload": w, "has_avg_jct_s": h, "sia_avg_jct_s": s,
           "opportunistic_avg_jct_s": o, "has_vs_sia_pct": 100 * (1 - h / s)}
          for w, h, s, o in rows]
    margins = sorted(w["has_vs_sia_pct"] for w in ws)
    return {"split": "validation", "max_jobs": 150, "error": "measured", "error_seed": seed,
            "clusters": {"c": {"workloads": ws, "has_vs_sia_median_pct": margins[len(ws) // 2],
                               "workloads_has_worse_than_sia_by_5pct":
                                   sum(m < -5 for m in margins)}}}


def test_pooled_margin_is_the_ratio_of_mean_jcts_and_the_median_the_middle_seed() -> None:
    runs = [_run(0, [("a", 90, 100, 200), ("b", 120, 100, 200)]),
            _run(1, [("a", 110, 100, 200), ("b", 100, 100, 200)]),
            _run(2, [("a", 100, 100, 200), ("b", 80, 100, 200)])]
    res = seed_pool.pool(runs)["clusters"]["c"]
    a, b = res["workloads"]
    assert a["has_vs_sia_pct_by_seed"] == pytest.approx([10.0, -10.0, 0.0])
    assert a["has_vs_sia_median_pct"] == pytest.approx(0.0)
    assert a["has_vs_sia_pooled_pct"] == pytest.approx(0.0)  # 1 - 100/100
    # b: -20, 0, +20 by seed; pooled 1 - 100/100 = 0; vs opportunistic 1 - 100/200
    assert b["has_vs_sia_median_pct"] == pytest.approx(0.0)
    assert b["has_vs_opportunistic_pooled_pct"] == pytest.approx(50.0)
    # seed 0 has b 20 % behind, seed 1 a 10 %: counted in those seeds, not by median or pooled
    assert res["per_seed_worse_than_sia_by_5pct"] == [1, 1, 0]
    assert res["worse_than_sia_by_5pct_median"] == 0
    assert res["worse_than_sia_by_5pct_pooled"] == 0


def test_runs_of_different_splits_or_a_repeated_seed_are_refused() -> None:
    one = _run(0, [("a", 90, 100, 200)])
    with pytest.raises(ValueError, match="share an error seed"):
        seed_pool.pool([one, _run(0, [("a", 90, 100, 200)])])
    other = _run(1, [("a", 90, 100, 200)])
    other["max_jobs"] = 20
    with pytest.raises(ValueError, match="differ"):
        seed_pool.pool([one, other])
    # a run whose policies planned on corrected step times is not pooled with one that did not
    corrected = _run(1, [("a", 90, 100, 200)])
    corrected["correct"] = True
    with pytest.raises(ValueError, match="correction"):
        seed_pool.pool([one, corrected])


def test_cli_reads_last_lines_and_names_a_bad_file(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    good = [tmp_path / "s0.txt", tmp_path / "s1.txt"]
    for i, p in enumerate(good):
        p.write_text("a table\n" + json.dumps(_run(i, [("a", 90 + 20 * i, 100, 200)])) + "\n")
    assert seed_pool.main([str(p) for p in good] + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["seeds"] == [0, 1]
    assert out["clusters"]["c"]["workloads"][0]["has_vs_sia_pooled_pct"] == pytest.approx(0.0)
    bad = tmp_path / "bad.txt"
    bad.write_text("not json\n")
    with pytest.raises(SystemExit):
        seed_pool.main([str(bad)])
    assert "bad.txt: not a benchmarks.validation --json output" in capsys.readouterr().err
