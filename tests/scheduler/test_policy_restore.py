"""The deadline policies' ``restore``: the state ``decide`` carries between calls (admitted and
best-effort sets, the opportunity-cost arrival window) is rebuilt from the notes handed out,
so a restarted service neither re-admits nor rejects a job it had admitted."""

from __future__ import annotations

import pytest
from builders import apply_decisions, cluster, make_node, make_plan

from scheduler.decision import DecisionKind
from scheduler.job import JobView, RunningJob
from scheduler.policies.deadline import DeadlineNote
from scheduler.policy import PolicyNote, make_policy, restore, take_notes

A100 = "A100-40G"


def job(job_id: str, *, gpus: int, deadline: float, submit: float,
        done: float = 0.0) -> JobView:
    """100 steps of 1 s on ``gpus`` A100s (its only plan): 100 s of work, 110 s with the
    launch."""
    return JobView(id=job_id, submit_time=submit, plans=(make_plan(A100, gpus, step_s=1.0),),
                   total_steps=100, steps_done=done, deadline=deadline, requested_gpus=gpus)


def test_notes_then_restore_rebuild_the_state_worked_out_by_hand() -> None:
    state = cluster(make_node("a0", A100, 8))
    a = job("a", gpus=4, deadline=1000.0, submit=0.0)
    b = job("b", gpus=4, deadline=1000.0, submit=1.0)
    c = job("c", gpus=8, deadline=50.0, submit=2.0)  # 110 s of work, due in 50 s: rejected
    pol = make_policy("elastic")
    first = pol.decide(state, [a, b, c], [], 5.0)
    assert {d.job_id for d in first if d.kind is DecisionKind.REJECT} == {"c"}
    notes = {n.job_id: DeadlineNote.from_data(n.data) for n in take_notes(pol)}
    # By hand: a and b are admitted; c was seen (it counts in the arrival window) and
    # rejected; arrivals in submit order, each with the fewest GPUs meeting its deadline and
    # their GPU-seconds (4 GPUs × 110 s = 440).
    assert notes == {
        "a": DeadlineNote("admitted", None, (0, 0.0, ((A100, 4),), ((A100, 440.0),))),
        "b": DeadlineNote("admitted", None, (1, 1.0, ((A100, 4),), ((A100, 440.0),))),
        "c": DeadlineNote(None, None, (2, 2.0, (), ())),
    }
    assert take_notes(pol) == []  # handed out once

    # The service stores the JSON form and gives it back to a fresh policy, with the live
    # jobs (c has ended) and c's note as history.
    stored = [PolicyNote(j, DeadlineNote.from_data(d.to_data()).to_data())
              for j, d in notes.items()]
    applied = apply_decisions(state, [], [d for d in first
                                          if d.kind is not DecisionKind.REJECT])
    running = [RunningJob(j, applied.holding[j.id], 5.0) for j in (a, b)
               if j.id in applied.holding]
    pending = [j for j in (a, b) if j.id not in applied.holding]
    assert [r.job.id for r in running] == ["a", "b"]  # 4 + 4 GPUs of 8: both run
    fresh = make_policy("elastic")
    restore(fresh, [a, b], stored)
    eng, eng0 = fresh.engine, pol.engine
    assert eng.ledger.admitted == eng0.ledger.admitted == {"a", "b"}
    assert eng.ledger.best_effort == eng0.ledger.best_effort == set()
    assert list(eng.window.arrivals) == list(eng0.window.arrivals) == [
        (0.0, {A100: 4}), (1.0, {A100: 4}), (2.0, {})]
    assert list(eng.window.work) == list(eng0.window.work) == [
        {A100: 440.0}, {A100: 440.0}, {}]
    assert eng.window.seq == eng0.window.seq == 3

    # The next call decides the same, with the same bookings, as the policy that never
    # stopped; and neither admits a or b again (no new notes).
    after = fresh.decide(applied.state, pending, running, 60.0)
    before = pol.decide(applied.state, pending, running, 60.0)
    assert [(d.kind, d.job_id, d.allocation) for d in after] == \
        [(d.kind, d.job_id, d.allocation) for d in before]
    assert fresh.engine.bookings == pol.engine.bookings
    assert set(fresh.engine.bookings) == {"a", "b"}
    assert take_notes(fresh) == take_notes(pol) == []


def test_restore_without_notes_admits_again() -> None:
    """What restore prevents: a policy that lost its state treats an admitted job that fell
    behind as a new arrival and rejects it, where the one that kept it keeps it best-effort
    (its guarantee honoured as far as it goes: never rejected)."""
    state = cluster(make_node("a0", A100, 4))
    a = job("a", gpus=4, deadline=200.0, submit=0.0)
    pol = make_policy("elastic")
    assert not [d for d in pol.decide(state, [a], [], 0.0) if d.kind is DecisionKind.REJECT]
    stored = take_notes(pol)
    late = job("a", gpus=4, deadline=200.0, submit=0.0, done=10.0)  # 90 s left at t=150
    forgot = make_policy("elastic")
    assert [d.kind for d in forgot.decide(state, [late], [], 150.0)] == [DecisionKind.REJECT]
    kept = make_policy("elastic")
    restore(kept, [late], stored)
    out = kept.decide(state, [late], [], 150.0)
    assert [d.kind for d in out] == [DecisionKind.START]


def test_a_note_written_before_the_gpu_seconds_were_kept_still_reads() -> None:
    """An arrival stored as [order, submit, need] reads back with no GPU-seconds (the window
    then prices bookings blocking it by the arrival rate alone)."""
    note = DeadlineNote.from_data({"status": "admitted", "arrival": [3, 7.5, [[A100, 2]]]})
    assert note.arrival == (3, 7.5, ((A100, 2),), ())


def test_a_malformed_note_names_the_field() -> None:
    with pytest.raises(ValueError, match="status"):
        DeadlineNote.from_data({"status": "maybe"})
    with pytest.raises(ValueError, match="arrival"):
        DeadlineNote.from_data({"arrival": [1, "x"]})
    with pytest.raises(ValueError, match="arrival"):
        DeadlineNote.from_data({"arrival": [1, 2.0, [], [], []]})
