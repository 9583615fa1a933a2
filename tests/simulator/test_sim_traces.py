"""Trace loaders: formats, named sets, and errors that name file, line and column."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulator.traces import TraceFormatError, load_trace, trace_files, traces_dir

DATA = Path(__file__).parent / "data"


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "t.csv"
    p.write_text(text)
    return p


def test_golden_fixture_loads_sorted() -> None:
    tr = load_trace(DATA / "golden_trace.csv")
    assert tr.format == "workload" and len(tr.jobs) == 30
    times = [j.submit_time for j in tr.jobs]
    assert times == sorted(times)
    assert tr.jobs[0].name == "bert-0" and tr.jobs[0].num_gpus == 4
    assert tr.jobs[0].gpu_time_s is None


def test_elasticflow_format_gives_gpu_time_and_deadline(tmp_path: Path) -> None:
    p = write(tmp_path, "job_id,submit_time,real_iteration,model_name,ddl,batch_size,num_gpu,"
                        "real_duration,duration,iteration\n"
                        "0,100,5,vgg16,5000,256,4,900,1000,5\n")
    (j,) = load_trace(p).jobs
    assert (j.name, j.application, j.num_gpus, j.gpu_time_s, j.deadline) == \
        ("job-0", "vgg16", 4, 4000.0, 5000.0)


@pytest.mark.parametrize("row,message", [
    ("a,xx,cifar10,1,32", r"t.csv:3: column 'time': 'xx' is not a number >= 0"),
    ("a,1,cifar10,0,32", r"t.csv:3: column 'num_replicas': '0'; expected a positive integer"),
    ("a,1,cifar10,2.5,32", r"t.csv:3: column 'num_replicas': '2.5' is not a positive integer"),
    ("a,1,,1,32", r"t.csv:3: column 'application': empty"),
    ("a,1,cifar10,1", r"t.csv:3: 4 fields; expected 5"),
    ("a,-4,cifar10,1,32", r"t.csv:3: column 'time': '-4'; expected a number >= 0"),
])
def test_malformed_rows_name_file_line_column(tmp_path: Path, row: str, message: str) -> None:
    p = write(tmp_path, f"name,time,application,num_replicas,batch_size\nok,0,bert,1,32\n{row}\n")
    with pytest.raises(TraceFormatError, match=message):
        load_trace(p)


def test_unknown_header_and_duplicates(tmp_path: Path) -> None:
    with pytest.raises(TraceFormatError, match=r"t.csv:1: unknown header a,b"):
        load_trace(write(tmp_path, "a,b\n1,2\n"))
    with pytest.raises(TraceFormatError, match="duplicate job name 'x'"):
        load_trace(write(tmp_path, "name,time,application,num_replicas,batch_size\n"
                                   "x,0,bert,1,32\nx,1,bert,1,32\n"))


def test_unknown_set_lists_the_known_ones() -> None:
    with pytest.raises(TraceFormatError, match=r"known sets: .*sia-philly"):
        trace_files("no-such-trace")


@pytest.mark.skipif(not traces_dir().exists(), reason="shared/traces not present")
def test_named_sets_resolve() -> None:
    assert len(trace_files("sia-philly")) == 8
    assert len(trace_files("sia-saturn")) == 10
    assert [p.stem for p in trace_files("sia-saturn:10")] == ["workload-10"]
    assert len(load_trace(trace_files("elasticflow")[0]).jobs) == 876
    assert len(load_trace(trace_files("pollux:1")[0]).jobs) == 160
