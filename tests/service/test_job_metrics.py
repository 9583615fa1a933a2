"""Per-step-window metrics: a progress report becomes one window on the job's row (bounded),
shown in GET /v1/jobs/{id} as the ``metrics`` block beside the plan's predictions."""

from __future__ import annotations

from types import SimpleNamespace

from service_builders import Env, job_body

from orchestrator.states import JobEvent, JobState
from service.db import repositories as repo
from service.db.engine import write_session
from service.job_metrics import appended, metric_window
from service.runner import EventRecorder


def test_a_window_turns_samples_per_s_into_tokens_per_s_and_step_time() -> None:
    # batch 32 sequences of 1024 tokens at 16 samples/s: 2.0 s a step, 16 384 tokens/s
    w = metric_window(at="t", data={"steps_done": 10, "loss": 3.5, "samples_per_s": 16.0},
                      training={"global_batch": 32, "seq_len": 1024},
                      predicted_step_time_s=1.6, predicted_memory_bytes=2e10)
    assert w == {"at": "t", "step": 10.0, "loss": 3.5, "tokens_per_s": 16384.0,
                 "step_time_s": 2.0, "predicted_step_time_s": 1.6, "memory_bytes": None,
                 "predicted_memory_bytes": 2e10}
    assert metric_window(at="t", data={"steps_done": 3}, training={}) is None  # no measure
    nan = metric_window(at="t", data={"loss": float("nan"), "samples_per_s": 8.0},
                        training={"global_batch": 32, "seq_len": 1024})
    assert nan is not None and nan["loss"] is None and nan["step_time_s"] == 4.0


def test_only_the_last_windows_are_kept() -> None:
    ws: list[dict] = []
    for i in range(7):
        ws = appended(ws, {"step": i}, keep=3)
    assert [w["step"] for w in ws] == [4, 5, 6]


def test_progress_reports_show_as_the_jobs_metrics_block(env: Env) -> None:
    job = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    with write_session(env.factory) as s:
        row = repo.get_job(session=s, job_id=job["id"], for_update=True)
        for to in (JobState.PLACED, JobState.STARTING, JobState.RUNNING):
            repo.transition_job(session=s, job=row, to=to, reason="test", now=env.clock())
    alloc = SimpleNamespace(plan=SimpleNamespace(step_time_s=1.6, model_tensors_bytes=2e10,
                                                 memory=SimpleNamespace(tensors=2e10)),
                            placement=())
    recorder = EventRecorder(env.factory)
    for step, loss in ((5, 4.0), (10, 3.0)):
        recorder(JobEvent(job["id"], 1000.0 + step, JobState.RUNNING, JobState.RUNNING,
                          "progress", alloc,  # type: ignore[arg-type]
                          {"steps_done": step, "loss": loss, "samples_per_s": 16.0}))
    got = env.client.get(f"/v1/jobs/{job['id']}", headers=env.headers("alice")).json()
    m = got["metrics"]
    assert [w["loss"] for w in m["windows"]] == [4.0, 3.0]
    assert m["latest"]["step"] == 10 and m["latest"]["tokens_per_s"] == 16384.0
    assert m["latest"]["step_time_s"] == 2.0 and m["latest"]["predicted_step_time_s"] == 1.6
    assert got["progress"]["steps_done"] == 10
    fresh = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    assert fresh["metrics"] is None


def _window(at: str, step: int, loss: float) -> dict:
    return {"at": at, "step": step, "loss": loss, "tokens_per_s": 16384.0, "step_time_s": 2.0,
            "predicted_step_time_s": 1.6, "memory_bytes": None,
            "predicted_memory_bytes": 2e10}


def _job(state: str, windows: list[dict]) -> dict:
    return {"id": "j1", "name": "demo", "model_name": "gpt2", "owner": "alice",
            "state": state, "state_reason": "r", "notes": [],
            "progress": {"steps_done": 10, "total_steps": 100, "fraction": 0.1},
            "plans": [], "chosen_plan": None,
            "metrics": {"windows": windows, "latest": windows[-1]} if windows else None}


def test_frenzy_jobs_id_shows_the_latest_window_and_a_loss_curve() -> None:
    from service.serve_cli import format_job, sparkline

    assert sparkline([4.0, 3.0, 2.0]) == "█▅▁"  # 1 + round((v-2)/2·7): 8, 1+round(3.5)=5, 1
    assert sparkline([1.0, 1.0]) == "▄▄"
    text = "\n".join(format_job(_job("RUNNING", [_window("a", 5, 4.0),
                                                 _window("b", 10, 2.0)])))
    assert "loss 2.0000" in text and "16,384 tokens/s" in text
    assert "step 2.000 s (predicted 1.600 s)" in text
    assert "█▁  4.0000 -> 2.0000" in text


def test_submit_follow_prints_new_windows_until_the_job_ends(
        monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from service import serve_cli

    # the states as the API writes them (JobState values)
    answers = iter([_job("pending", []), _job("running", [_window("a", 5, 4.0)]),
                    _job("running", [_window("a", 5, 4.0), _window("b", 10, 3.0)]),
                    _job("failed", [_window("a", 5, 4.0), _window("b", 10, 3.0)])])
    monkeypatch.setattr(serve_cli, "_call", lambda *a, **k: next(answers))
    assert serve_cli.follow_job("j1", sleep=lambda s: None) == 1  # FAILED: exit 1
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "[pending] r" and out[1] == "[running] r"
    assert [ln.split()[1] for ln in out if ln.startswith("  step")] == ["5/100", "10/100"]
    assert out[-1] == "[failed] r"


def test_frenzy_jobs_id_shows_measured_memory_and_out_of_memory_runs() -> None:
    from service.serve_cli import format_job

    job = _job("PENDING", [])
    job["memory"] = {"measured_tensors_bytes": 3 * 2**20, "source": "cpu-tracker",
                     "predicted_tensors_bytes": 2 * 2**20, "error_pct": 50.0,
                     "out_of_memory_runs": 1, "memory_factor": 1.65,
                     "last_out_of_memory": "t: a rank held 3,145,728 bytes"}
    text = "\n".join(format_job(job))
    assert "memory    3.0 MiB/rank measured (cpu-tracker), predicted 2.0 MiB (+50.0 %)" in text
    assert "oom       1 run(s), memory x1.65 since: t: a rank held 3,145,728 bytes" in text
