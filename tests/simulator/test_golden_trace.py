"""Golden-trace regression: a fixed 30-job trace on phoebe through ``has`` and
``opportunistic`` with pinned metrics, plus invariants that hold for any policy.

The pinned figures were recorded from this simulator (controller + SimBackend + analytical
step-time model + the policies) when the test was written; a change to any of them moves the
numbers, and the diff must then be explained and the pins updated on purpose.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.clusters import load_cluster
from orchestrator.states import JobState
from simulator.mapping import map_jobs
from simulator.replay import PlanCache, job_view, replay
from simulator.traces import load_trace

DATA = Path(__file__).parent / "data"

GOLDEN = {
    # policy: (avg JCT s, p99 JCT s, avg queue s, makespan s)
    # re-pinned when HAS gained shortest-predicted-first ordering, grow/shrink on idle GPUs
    # and shrinking long jobs for short ones (avg JCT 6303 s -> 4073 s on this trace), then
    # when it started jobs on their fastest plan at the knee and priced shrinks as loans
    # repaid first (4073 s -> 3059 s), then when a larger plan had to save >= 60 s (3040 s),
    # then when it grew and shrank in SRPT order with min_gain 0.3 and asked to be woken
    # when min_hold_s ends (3037 s -> 3227 s here: on 30 jobs the 3 yolov3 and 1 imagenet
    # jobs decide the average, and which of them gets the A100s first shifts it either way;
    # on the 18 full Sia workload files the average JCT fell 20%, see docs/jct.md)
    # re-pinned when the step-time model put tensor-parallel collectives under the host
    # dispatch floor, exposed the last gradient bucket, charged 2 ms per micro-batch, left the
    # head out of the 1F1B fill and took A100-40G bf16 at 0.75 of peak (calibrated on
    # llm-foundry; docs/step_time_accuracy.md): has avg JCT 3227 s -> 2854 s, makespan
    # +2.2 %; opportunistic avg JCT 4838 s -> 5002 s (+3.4 %), makespan +6.0 %
    # then re-pinned when plans needed their device figure (tensors + 7 % allocator slack +
    # CUDA context + NCCL) plus a 13 % margin, priced for the built-in trainer as it runs
    # (fp32 weights under autocast, embedding and head on every tp rank; issue 11,
    # docs/memory_accuracy.md), on top of the step-time change: jobs lose their densest plans
    # on the small GPUs (has avg JCT 2854 s -> 3604 s, makespan 42573 s -> 63131 s;
    # opportunistic 5002 s -> 5323 s)
    # then re-pinned when the simulator's plans were timed on phoebe's declared 12.5 GB/s
    # network instead of the A100's DGX default of 200 GB/s (issue 14, a model fix): the
    # 16xA100 plans change configuration and predicted time, so has's knee, queue order and
    # growth see the times the jobs really run at (has avg JCT 3604 s -> 3010 s, p99
    # 48125 s -> 32710 s, makespan 63131 s -> 41345 s; opportunistic unchanged)
    # then re-pinned when has grew onto GPUs nobody waits for past the knee and reclaimed
    # grown GPUs for a shorter arrival as a loan (issue 14; chosen on the tuning split,
    # docs/validation.md): avg JCT 3010 s -> 2991 s, p99 32710 s -> 31685 s, avg queue
    # 13.7 s -> 16.7 s, makespan 41345 s -> 39322 s; then when a loan was no longer repaid
    # onto a placement slower than where the lender runs and growth past the knee gave way
    # to any waiting job: avg JCT 2991 s -> 2990 s, makespan 39322 s -> 39315 s
    # then re-pinned when has stopped starting jobs on a dominated plan (one slower than
    # another plan of its GPU type at no fewer GPU-seconds a step; issue 14): imagenet-3
    # (llama-2-7b) no longer starts at 312 s on 4xA100 pp4 with full recomputation (20.4 s a
    # step, 81.6 GPU-s) beside its 8xA100 plan (7.6 s, 61.1 GPU-s) but on the 8 A100s a
    # moment later, and the jobs after it move: avg JCT 2990 s -> 2837 s, p99 31675 s ->
    # 32011 s, avg queue 16.7 s -> 12.0 s, makespan 39315 s -> 40400 s
    # then re-pinned when the built-in trainer split its embedding, head and cross entropy
    # over the tp ranks by vocabulary rows and the frenzy profile priced that (issue 11 item
    # 3): tp > 1 plans hold a 1/tp share of the head and its logits, so denser plans fit
    # (has avg JCT 2990 s -> 2986 s, makespan 39315 s -> 39197 s; opportunistic avg JCT
    # 5323 s -> 5288 s, makespan 57288 s -> 56241 s)
    # both changes together: has avg JCT 2837 s -> 2836 s, p99 32011 s -> 31985 s, makespan
    # 40400 s -> 40363 s; opportunistic as the vocab-parallel change alone
    # then re-pinned when has, once nobody waits, started a job wide on idle GPUs (a plan
    # >= 10 % faster that saves >= min_saving_s; no restart, it has not launched) and let a
    # job with more work left move to an idle GPU type so that one with less grows onto its
    # GPUs (issue 14; chosen on the tuning split, docs/validation.md): two jobs start on 24
    # instead of 16 RTX2080Ti (1.67 -> 1.34 s a step), and yolov3-12 moves RTX6000 ->
    # A100-40G so that cifar10-24 doubles its RTX6000s, later A100-40G -> RTX6000 so that
    # yolov3-5 doubles its A100s; avg JCT 2836 s -> 2811 s, p99 31985 s -> 31943 s, avg
    # queue 12.0 s -> 12.1 s, makespan 40363 s -> 40532 s, restarts 36 -> 47
    # then re-pinned when the built-in trainer ran ZeRO-3 and the frenzy profile priced it as
    # it runs (issue 11 item 3: the embedding and head whole, the running layer gathered;
    # before, every weight was priced sharded and no layer gathered): the same plans, but
    # the three ZeRO-3 ones of two jobs need 1.2-5.5 % more memory, which moves their
    # placement (has avg JCT 2811 s -> 2794 s, p99 31943 s -> 31565 s, makespan 40532 s ->
    # 40001 s; opportunistic avg JCT 5288 s -> 5256 s, p99 48229 s -> 47553 s, makespan
    # 56241 s -> 55289 s)
    # then re-pinned when a wide start no longer had to save min_saving_s (widen_min_saving_s
    # 0, chosen on the tuning split with Alibaba openb's even windows, docs/validation.md):
    # cifar10-1/-6/-7 start wide and end 22 s sooner each (83 s -> 61 s), while ncf-2 and
    # ncf-8, arriving after them, find the A100s taken and run on 4 RTX6000s (84 s -> 178 s);
    # avg JCT 2794 s -> 2795 s, p99 31565 s -> 31550 s, makespan 40001 s -> 39982 s
    # then re-pinned when the allocator slack was refit with torchtitan's reserved rows (0.07
    # -> 0.09, docs/memory_accuracy.md): every plan needs 1.8 % more; imagenet-3's 4xA100-40G
    # plan tp1 pp4 mb1 (42.36 GB of the 42.95) no longer fits, so its shrunk runs use tp2 pp2
    # mb2 (20.57 s a step for 20.39 s), which shifts when ncf-2/-8/-13/-27 and yolov3-5/-10/-12
    # get GPUs (has avg JCT 2795 s -> 2774 s, p99 31550 s -> 31358 s, makespan 39982 s ->
    # 39779 s; opportunistic avg JCT 5256 s -> 5258 s, makespan 55289 s -> 55124 s)
    # then re-pinned when undoing a grown job's growth for a waiting one shrank it only as
    # far as frees what that job needs (the largest plan of no more GPU-seconds), not to its
    # cheapest plan (issue 14; chosen on the tuning split, docs/validation.md): yolov3-5/-12
    # and bert-19/deepspeech2-23 go 4 -> 2 A100-40G instead of 4 -> 1, so the next arrivals
    # shrink them (and imagenet-3: 9 -> 17 restarts) once more instead of finding GPUs free;
    # has avg JCT 2774 s -> 2784 s, p99 31358 s -> 31417 s, avg queue 12.0 s -> 23.1 s,
    # makespan 39779 s -> 39871 s (a loaded trace where freeing more at once served the
    # next arrivals; over the tuning split's 32 workloads the rule lowers avg JCT on both
    # clusters)
    # then re-pinned when has undid a grown job's growth for a waiting one only if what the
    # grown job loses (a restart each way, its speed while the other runs) is below what
    # waiting costs (until GPUs free for the waiting job, times the jobs waiting; issue 14,
    # chosen on the tuning split, docs/validation.md round 20): imagenet-3 keeps its GPUs
    # longer (39765 s -> 38017 s), bert-15/-19 and deepspeech2-26 wait longer for them but end
    # sooner on them, yolov3-12 and deepspeech2-16/-23 end later; restarts 47 -> 31, has avg
    # JCT 2784 s -> 2746 s, p99 31417 s -> 30602 s, avg queue 23.1 s -> 61.9 s, makespan
    # 39871 s -> 38122 s
    "has": (2746.3188841551973, 30601.606133653513, 61.871615741753914, 38122.26459548063),
    "opportunistic": (5258.192461367681, 47490.35907136873, 271.83562780864105,
                      55124.26762484427),
}


@pytest.fixture(scope="module")
def setup():  # type: ignore[no-untyped-def]
    state = load_cluster("phoebe").state
    cache = PlanCache(state)
    views = [job_view(m, cache) for m in map_jobs(load_trace(DATA / "golden_trace.csv").jobs)]
    return state, views


@pytest.mark.parametrize("policy", sorted(GOLDEN))
def test_pinned_metrics(setup, policy: str) -> None:  # type: ignore[no-untyped-def]
    state, views = setup
    res = replay(views, state, policy)
    m = res.metrics
    assert (m.jobs, m.finished, m.unfinished) == (30, 30, 0)
    got = (m.avg_jct_s, m.p99_jct_s, m.avg_queue_s, m.makespan_s)
    assert got == pytest.approx(GOLDEN[policy], rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("policy", sorted(GOLDEN))
def test_invariants(setup, policy: str) -> None:  # type: ignore[no-untyped-def]
    state, views = setup
    res = replay(views, state, policy)
    ctl = res.controller
    assert ctl.cluster == state  # every GPU returned
    for v in views:
        rec = ctl.job(v.id)
        assert rec.state is JobState.SUCCEEDED
        assert rec.first_start is not None and rec.end_time is not None
        assert v.submit_time <= rec.first_start <= rec.end_time
        # never faster than its fastest placed speed allows
        fastest = min(res.backend.step_time_by_job[v.id])
        assert rec.end_time - rec.first_start >= v.total_steps * fastest * (1 - 1e-9)
    util = res.metrics.gpu_util
    assert set(util) == set(state.total_by_type()) and all(0 <= u <= 1 for u in util.values())


@pytest.mark.parametrize("policy", ["has", "sia"])
def test_restarts_counted_as_the_controller_counts(setup, policy: str) -> None:  # type: ignore[no-untyped-def]
    """The metrics' restarts (read from the event stream) equal the restarts the controller
    charged to the jobs themselves (``JobView.restarts``), job by job."""
    state, views = setup
    res = replay(views, state, policy)
    by_ctl = {jid: rec.view.restarts for jid, rec in res.controller.jobs.items()}
    by_events = {jid: rec.restarts for jid, rec in res.collector.jobs.items()}
    assert by_events == by_ctl
    assert res.metrics.restarts == sum(by_ctl.values())
    assert res.metrics.restarts_per_job == pytest.approx(sum(by_ctl.values()) / 30)
