"""The job state machine: every allowed move works, every other raises."""

from __future__ import annotations

import itertools

import pytest

from orchestrator.states import (
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    JobState,
    submitted,
    transition,
)


def test_happy_path_with_resize() -> None:
    path = [JobState.PENDING, JobState.PLACED, JobState.STARTING, JobState.RUNNING,
            JobState.RESIZING, JobState.RUNNING, JobState.SUCCEEDED]
    for t, (a, b) in enumerate(itertools.pairwise(path)):
        ev = transition("j", float(t), a, b, "why")
        assert (ev.job_id, ev.time, ev.from_state, ev.to_state, ev.reason) == ("j", t, a, b, "why")


@pytest.mark.parametrize("src,dst", [
    (s, d) for s in JobState for d in JobState if d not in TRANSITIONS[s]
])
def test_every_disallowed_move_raises(src: JobState, dst: JobState) -> None:
    with pytest.raises(IllegalTransition, match=f"job x: {src.value} → {dst.value}"):
        transition("x", 0.0, src, dst, "no")


def test_terminal_states_go_nowhere_and_others_can_fail_or_cancel() -> None:
    for s in JobState:
        if s in TERMINAL:
            assert not TRANSITIONS[s] and s.terminal and not s.holds_gpus
        else:
            assert {JobState.FAILED, JobState.CANCELLED} <= TRANSITIONS[s]


def test_preemption_returns_to_queue_from_every_holding_state() -> None:
    for s in (JobState.PLACED, JobState.STARTING, JobState.RUNNING, JobState.RESIZING):
        assert s.holds_gpus
        assert transition("j", 1.0, s, JobState.PENDING, "preempted").to_state is JobState.PENDING


def test_submission_event() -> None:
    ev = submitted("j", 5.0)
    assert ev.from_state is None and ev.to_state is JobState.PENDING and ev.time == 5.0
