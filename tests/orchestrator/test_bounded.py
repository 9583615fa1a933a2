"""Bounded memory: ended jobs leave the Controller's working set once their final event has
reached the listeners; what it keeps of ended jobs and policy calls has a fixed bound. Times
worked by hand from the simulator's model (finish = start + launch delay + steps x step
time), as in test_loop."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from orch_fakes import FifoPolicy, IdentityPerf, cluster, job

from orchestrator.backend import Finished, VirtualClock
from orchestrator.backends.sim import SimBackend
from orchestrator.controller import Controller, ControllerError, JobRecord
from orchestrator.loop import TURN_BUCKETS_S, ControlLoop, ListJobSource, LoopStats
from orchestrator.states import JobEvent, JobState
from scheduler.job import JobView


def run(jobs: Sequence[JobView], **kw: object) -> tuple[ControlLoop, SimBackend, list[str]]:
    """Run ``jobs`` one at a time on one GPU; the log interleaves events and retirements."""
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), cluster(1), launch_delay_s=10,
                    keep_step_times=bool(kw.pop("keep_step_times", True)))
    seen: list[str] = []

    def on_event(ev: JobEvent) -> None:
        if ev.to_state.terminal:
            seen.append(f"{ev.job_id}:{ev.to_state.value}")

    def on_retired(rec: JobRecord) -> None:
        seen.append(f"{rec.view.id}:retired")

    loop = ControlLoop(FifoPolicy(), be, ListJobSource(jobs), clock,  # type: ignore[arg-type]
                       listeners=[on_event], retire_listeners=[on_retired], tick_s=None,
                       **kw)  # type: ignore[arg-type]
    loop.run_virtual()
    return loop, be, seen


def test_ended_jobs_leave_the_working_set_after_their_final_event() -> None:
    jobs = [job(f"j{i}", t=0, steps=10, step_s=1.0) for i in range(5)]
    loop, _be, seen = run(jobs, keep_finished=2)
    ctl = loop.controller
    # FIFO on one GPU: j0 runs 10..20, j1 placed at 20 runs 30..40, ... j4 ends at 100.
    assert seen == [x for i in range(5) for x in (f"j{i}:succeeded", f"j{i}:retired")]
    assert len(ctl.live) == 0 and not ctl.active()
    assert ctl.ended == {JobState.SUCCEEDED: 5}
    assert ctl.job("j4").end_time == 100.0 and ctl.job("j3").end_time == 80.0
    assert set(ctl.jobs) == {"j3", "j4"} and len(ctl.jobs) == 2 and "j0" not in ctl.jobs
    with pytest.raises(ControllerError, match="unknown job 'j0'"):
        ctl.job("j0")


def test_keep_finished_zero_keeps_no_ended_job_and_none_keeps_all() -> None:
    jobs = [job(f"j{i}", t=0, steps=10, step_s=1.0) for i in range(3)]
    assert len(run(jobs, keep_finished=0)[0].controller.jobs) == 0
    assert set(run(jobs, keep_finished=None)[0].controller.jobs) == {"j0", "j1", "j2"}
    with pytest.raises(ValueError, match="keep_finished must be >= 0"):
        run(jobs, keep_finished=-1)


def test_a_late_backend_event_for_a_retired_job_is_ignored() -> None:
    loop, _be, _seen = run([job("a", steps=10, step_s=1.0)], keep_finished=0)
    ctl = loop.controller
    ctl.on_event(Finished("a", 99.0))  # e.g. a duplicate report after it ended
    assert ctl.ended == {JobState.SUCCEEDED: 1} and not ctl.active()


def test_policy_call_timings_keep_a_bounded_window_and_a_count() -> None:
    jobs = [job(f"j{i}", t=0, steps=10, step_s=1.0) for i in range(5)]
    ctl = run(jobs, keep_policy_calls=3)[0].controller
    # A call at t=0 (5 queued), at each start (10, 30, 50, 70, 90: 4, 3, 2, 1, 0 queued,
    # one running) and at each finish but the last (20, 40, 60, 80: 4, 3, 2, 1 queued,
    # none running; at 100 nothing is left, so no call): 10 calls, the latest three kept
    # (t = 70, 80, 90).
    assert ctl.policy_call_count == 10
    assert len(ctl.policy_calls) == 3 and len(ctl.policy_wall_s) == 3
    assert [(p, r) for p, r, _ in ctl.policy_calls] == [(1, 1), (1, 0), (0, 1)]


def test_the_simulated_backend_forgets_step_times_of_ended_jobs_when_asked() -> None:
    jobs = [job(f"j{i}", t=0, steps=10, step_s=1.0) for i in range(2)]
    assert set(run(jobs)[1].step_time_by_job) == {"j0", "j1"}
    assert run(jobs, keep_step_times=False)[1].step_time_by_job == {}


def test_turn_histogram_counts_each_turn_in_its_bucket() -> None:
    stats = LoopStats()
    for s in (0.00005, 0.0001, 0.00011, 0.5, 100.0):
        stats.record_turn(s)
    assert TURN_BUCKETS_S[0] == 0.0001 and TURN_BUCKETS_S[1] == 0.00011
    # <= 0.1 ms: 2 turns; (0.1, 0.11] ms: 1; 0.5 s in the bucket (1e-4 * 1.1**k) just above;
    # 100 s beyond the last bound (about 10 s).
    k = next(i for i, b in enumerate(TURN_BUCKETS_S) if b >= 0.5)
    assert stats.turn_hist[0] == 2 and stats.turn_hist[1] == 1
    assert stats.turn_hist[k] == 1 and stats.turn_hist[-1] == 1
    assert sum(stats.turn_hist) == stats.turns == 5
    assert stats.turn_s_sum == pytest.approx(100.50026)
    assert len(stats.turn_hist) == len(TURN_BUCKETS_S) + 1


def test_controller_rejects_a_negative_bound() -> None:
    clock = VirtualClock()
    be = SimBackend(clock, IdentityPerf(), cluster(1))
    with pytest.raises(ValueError, match="keep_policy_calls must be >= 0"):
        Controller(FifoPolicy(), be, cluster(1), clock,  # type: ignore[arg-type]
                   keep_policy_calls=-2)
