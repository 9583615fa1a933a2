"""The Alibaba GPU v2023 (openb) pod list read as a training trace, and windowed trace sets."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator import traces
from simulator.mapping import map_job
from simulator.traces import (
    TraceFormatError,
    load_trace,
    load_traces,
    trace_files,
    traces_dir,
    windows,
)

HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
          "deletion_time,scheduled_time\n")

# Hand-built: the trace ends at 500000 (latest deletion_time); creations jump from 0 to
# 200000 (a gap > 1 day), so the collection starts at 200000.
ROWS = [
    "p-early,8000,1,1,1000,,LS,Running,0,400000,0",  # before the collection
    "p-cpu,4000,1,0,0,,BE,Running,200000,200100,200000",  # no GPU
    "p-share,4000,1,1,500,,LS,Running,200010,200900,200010",  # half a GPU
    "p-a,4000,1,2,1000,,BE,Succeeded,200020,203630,200030",  # 2 GPUs x 3600 s (waited 10 s)
    "p-b,4000,1,1,1000,,BE,Failed,200040,200340,200040",  # kept: ran 300 s
    "p-pend,4000,1,1,1000,,BE,Pending,200050,200100,",  # never ran
    "p-c,4000,1,8,1000,,LS,Running,200060,210100,200100",  # 8 GPUs x 10000 s
    "p-cut,4000,1,1,1000,,LS,Running,200070,500000,200070",  # running at the end: cut off
    "p-e,4000,1,1,1000,,LS,Succeeded,200090,500000,200090",  # ended at the end: kept
    "p-d,4000,1,4,1000,,LS,Running,200015,201015,200015",  # 4 GPUs x 1000 s, listed last
]


def write(tmp_path: Path, rows: list[str], name: str = "openb.csv") -> Path:
    p = tmp_path / name
    p.write_text(HEADER + "".join(r + "\n" for r in rows))
    return p


def test_whole_gpu_pods_that_ran_become_jobs_by_arrival(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, ROWS))
    assert tr.format == "openb"
    got = [(j.name, j.submit_time, j.num_gpus, j.gpu_time_s) for j in tr.jobs]
    assert got == [
        ("p-d", 200015.0, 4, 4000.0),
        ("p-a", 200020.0, 2, 7200.0),  # run time from scheduled_time, not creation_time
        ("p-b", 200040.0, 1, 300.0),
        ("p-c", 200060.0, 8, 80000.0),
        ("p-e", 200090.0, 1, 299910.0),
    ]
    assert tr.dropped == {"no_gpu": 1, "gpu_sharing": 1, "never_ran": 1,
                          "before_collection": 1, "cut_off_at_end": 1}
    assert all(j.deadline is None and j.application == "openb" for j in tr.jobs)
    assert tr.jobs[0].origin.endswith("openb.csv:11")  # the last data row


def test_load_is_deterministic_and_independent_of_row_order(tmp_path: Path) -> None:
    a = load_trace(write(tmp_path, ROWS, "a.csv"))
    b = load_trace(write(tmp_path, list(reversed(ROWS)), "b.csv"))
    key = [(j.name, j.submit_time, j.num_gpus, j.gpu_time_s) for j in a.jobs]
    assert key == [(j.name, j.submit_time, j.num_gpus, j.gpu_time_s) for j in b.jobs]
    assert a.dropped == b.dropped
    assert load_trace(write(tmp_path, ROWS, "a.csv")) == a


def test_no_gap_longer_than_a_day_keeps_every_pod(tmp_path: Path) -> None:
    # p-early created at 150000: 50000 s before the next creation, within a day
    rows = [ROWS[0].replace(",Running,0,400000,0", ",Running,150000,400000,150000"), *ROWS[1:]]
    tr = load_trace(write(tmp_path, rows))
    assert tr.jobs[0].name == "p-early" and tr.jobs[0].gpu_time_s == 250000.0
    assert tr.dropped["before_collection"] == 0


def test_an_openb_job_maps_by_its_gpu_time(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, ROWS))
    by = {j.name: j for j in tr.jobs}
    # 7200 GPU-s = 2 GPU-h: the 1-10 GPU-h class, a decoder (GPT-2 medium)
    mj = map_job(by["p-a"])
    assert (mj.size_class, mj.model.name, mj.gpu_time_s) == ("small", "gpt2-medium", 7200.0)
    assert map_job(by["p-b"]).size_class == "tiny"  # 300 GPU-s = 0.083 GPU-h
    assert map_job(by["p-d"]).size_class == "small"  # 4000 GPU-s = 1.11 GPU-h
    assert map_job(by["p-c"]).size_class == "medium"  # 80000 GPU-s = 22.2 GPU-h
    assert map_job(by["p-e"]).size_class == "medium"  # 299910 GPU-s = 83.3 GPU-h


@pytest.mark.parametrize("row,message", [
    ("x,1,1,1,1500,,LS,Running,200001,200002,200001",
     r"openb.csv:12: column 'gpu_milli': '1500'; expected an integer in 0..1000"),
    ("x,1,1,1,1000,,LS,Done,200001,200002,200001",
     r"openb.csv:12: column 'pod_phase': 'Done'; expected one of Running, Succeeded, Failed, "
     r"Pending"),
    ("x,1,1,one,1000,,LS,Running,200001,200002,200001",
     r"openb.csv:12: column 'num_gpu': 'one' is not an integer >= 0"),
    ("x,1,1,1,1000,,LS,Running,-5,200002,200001",
     r"openb.csv:12: column 'creation_time': '-5'; expected a number >= 0"),
    ("x,1,1,1,1000,,LS,Running,200001,200002,",
     r"openb.csv:12: column 'scheduled_time': empty; expected a number >= 0"),
    ("x,1,1,1,1000,,LS,Failed,200001,200000,200000",
     r"openb.csv:12: column 'scheduled_time': '200000'; expected a time >= creation_time"),
    ("x,1,1,1,1000,,LS,Failed,200001,200001,200001",
     r"openb.csv:12: column 'deletion_time': '200001'; expected a time > scheduled_time "
     r"\(200001\) for a Failed pod"),
    ("x,1,1,1,1000,,LS,Running,200001,",
     r"openb.csv:12: 10 fields; expected 11"),
])
def test_bad_rows_name_file_line_column(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(TraceFormatError, match=message):
        load_trace(write(tmp_path, [*ROWS, row]))


def test_a_fractional_pod_is_not_checked_for_run_times(tmp_path: Path) -> None:
    # a GPU-sharing pod with no scheduled_time is no job and no error
    tr = load_trace(write(tmp_path, [*ROWS, "x,1,1,1,300,,LS,Running,200001,200002,"]))
    assert tr.dropped["gpu_sharing"] == 2 and len(tr.jobs) == 5


def test_windows_are_consecutive_and_start_at_zero(tmp_path: Path) -> None:
    tr = load_trace(write(tmp_path, ROWS))
    w = windows(tr, 2)
    assert [x.name for x in w] == ["openb:1", "openb:2"]  # p-e, the fifth job, makes none
    assert [(j.name, j.submit_time) for j in w[0].jobs] == [("p-d", 0.0), ("p-a", 5.0)]
    assert [(j.name, j.submit_time) for j in w[1].jobs] == [("p-b", 0.0), ("p-c", 20.0)]
    assert w[1].jobs[1].gpu_time_s == 80000.0
    assert windows(tr, 6) == []
    with pytest.raises(ValueError, match="at least 1"):
        windows(tr, 0)


def test_a_windowed_set_names_each_window(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, ROWS)
    monkeypatch.setenv("FRENZY_TRACES_DIR", str(tmp_path))
    monkeypatch.setitem(traces.TRACE_SETS, "tiny-openb", "openb.csv")
    monkeypatch.setitem(traces.TRACE_WINDOWS, "tiny-openb", 2)
    got = load_traces("tiny-openb")
    assert [label for label, _ in got] == ["tiny-openb:1", "tiny-openb:2"]
    ((label, w2),) = load_traces("tiny-openb:2")
    assert label == "tiny-openb:2" and [j.name for j in w2.jobs] == ["p-b", "p-c"]
    assert trace_files("tiny-openb:2") == [tmp_path / "openb.csv"]
    for bad in ("3", "0", "x"):
        with pytest.raises(TraceFormatError, match=r"has windows 1..2 of 2 jobs; got"):
            load_traces(f"tiny-openb:{bad}")
    monkeypatch.setitem(traces.TRACE_WINDOWS, "tiny-openb", 6)
    with pytest.raises(TraceFormatError, match="has 5 jobs, fewer than one window of 6"):
        load_traces("tiny-openb")


@pytest.mark.skipif(not (traces_dir() / "alibaba-gpu-v2023").exists(),
                    reason="shared/traces/alibaba-gpu-v2023 not present")
def test_the_alibaba_set_reads_as_counted_by_hand() -> None:
    (path,) = trace_files("alibaba-openb")
    tr = load_trace(path)
    # SOURCE.md: 8,152 pods, 7,064 with GPUs, 3,986 on whole GPUs; of those 356 Pending (no
    # scheduled_time), 21 Running until the last deletion_time, and 7 others created before
    # day 114.9 (the last gap of more than a day between creations ends there)
    assert tr.dropped == {"no_gpu": 8152 - 7064, "gpu_sharing": 7064 - 3986, "never_ran": 356,
                          "before_collection": 15, "cut_off_at_end": 13}
    assert len(tr.jobs) == 3986 - 356 - 21 - 7 == 3602
    wins = load_traces("alibaba-openb")
    assert len(wins) == 3602 // 150 == 24
    assert wins[0][0] == "alibaba-openb:1" and wins[0][1].jobs[0].name == "openb-pod-0026"
    assert all(len(w.jobs) == 150 and w.jobs[0].submit_time == 0.0 for _, w in wins)
