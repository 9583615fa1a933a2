"""The allocator-reserve table read from the committed GPU rows: what it groups, and the
recompute difference it derives (on hand-made rows and on the committed ones)."""

from __future__ import annotations

import pytest

from benchmarks import allocator_slack as al


def _rows(full: list[float], other: list[float]) -> list[dict]:
    return ([{"recompute": "full", "ratio": r} for r in full]
            + [{"recompute": "none", "ratio": r} for r in other])


def test_the_recompute_slack_is_the_difference_of_the_medians() -> None:
    # medians 1.20 and 1.05 -> 0.15
    assert al.fit_recompute_slack(_rows([1.1, 1.2, 1.3], [1.0, 1.05, 1.1])) == 0.15


def test_it_needs_rows_on_both_sides() -> None:
    with pytest.raises(ValueError, match="with and without"):
        al.fit_recompute_slack(_rows([1.2], []))


@pytest.mark.skipif(not al.GPU_RUNS.exists(), reason="committed GPU rows absent")
def test_committed_rows_group_every_row_once() -> None:
    rows = al.load(al.FIT_FILES) + al.load(al.CHECK_FILES)
    assert rows and all(r["ratio"] >= 1.0 for r in rows)  # reserved holds every tensor
    groups = al.groups(rows)
    assert sum(g["n"] for g in groups) == len(rows)
    assert {g["trainer"] for g in groups} == {"frenzy", "hf-trainer", "lightning"}
    assert {r["allocator"] for r in rows} == {"default", "expandable"}
    assert all(r["file"] in ("hf_trainer_h200_expandable.jsonl", "hf_fragmentation_h200.jsonl")
               for r in rows if r["allocator"] == "expandable")
    # the built-in trainer's own rows and the Hugging Face ones agree in sign: full
    # recomputation holds more in reserve
    assert al.fit_recompute_slack(al.load(al.FIT_FILES)) > 0
    assert al.fit_recompute_slack(al.load(al.CHECK_FILES)) > 0
