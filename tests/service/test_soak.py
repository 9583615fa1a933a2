"""``benchmarks.soak``: its histogram arithmetic by hand, and a short real run (300 jobs
through ``frenzy serve --backend sim`` over HTTP) that checks the figures it reports."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.soak import parse_histogram, window_quantile

ROOT = Path(__file__).resolve().parents[2]

EXPOSITION = """# TYPE frenzy_loop_turn_seconds histogram
frenzy_loop_turn_seconds_bucket{le="0.001"} 4
frenzy_loop_turn_seconds_bucket{le="0.002"} 14
frenzy_loop_turn_seconds_bucket{le="+Inf"} 15
frenzy_loop_turn_seconds_sum 0.1
frenzy_loop_turn_seconds_count 15
"""


def test_a_window_quantile_comes_from_the_difference_of_two_scrapes() -> None:
    after = parse_histogram(EXPOSITION, "frenzy_loop_turn_seconds")
    assert after == [(0.001, 4), (0.002, 14), (math.inf, 15)]
    before = [(0.001, 4), (0.002, 4), (math.inf, 5)]
    # Between the scrapes: 0 turns <= 1 ms, 10 in (1, 2] ms, 0 beyond. The median is rank
    # 5 of 10: half-way into (1, 2] ms -> 1.5 ms; p90 rank 9 -> 1.9 ms.
    assert window_quantile(before, after, 0.5) == pytest.approx(0.0015)
    assert window_quantile(before, after, 0.9) == pytest.approx(0.0019)
    # From nothing: 4 in (0, 1] ms, 10 in (1, 2], 1 beyond. p20 = rank 3 of 15, 3/4 into
    # the first bucket -> 0.75 ms; p99 = rank 14.85 falls beyond 2 ms -> reported as 2 ms.
    zero = [(b, 0) for b, _ in after]
    assert window_quantile(zero, after, 0.2) == pytest.approx(0.00075)
    assert window_quantile(zero, after, 0.99) == pytest.approx(0.002)
    assert math.isnan(window_quantile(after, after, 0.5))


def test_a_short_soak_reports_its_figures() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.soak", "--jobs", "300", "--rate", "60", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=True,
    )
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["jobs"] == 300 and res["succeeded"] == 300 and res["submit_errors"] == 0
    assert res["window"] == 100
    # A 300-job run moves the service's RSS by a few MiB (2.7 measured); 100 would mean
    # the ended jobs are kept.
    assert -50 < res["rss_growth_mib"] < 100
    assert res["tick_p99_ratio"] > 0 and res["tick_p99_first_ms"] > 0
    assert res["turns_first"] > 0 and res["turns_last"] > 0
    assert [p["point"] for p in res["points"]][-1] == "all ended"
    assert res["points"][-1]["live_jobs"] == 0
    assert "turn p99 last/first" in out.stdout
