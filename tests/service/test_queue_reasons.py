"""The queue explained: typed reasons and numbers worked out by hand (module docstring of
service.queue_reasons: FIFO per GPU type, GPUs freed at the running jobs' predicted ends)."""

from __future__ import annotations

import pytest

from service.queue_reasons import Holding, Need, Queued, WaitKind, explain_queue

A = "A100-80G"


def test_reasons_and_earliest_starts_by_hand() -> None:
    # 8 A100s, 2 free: X holds 4 until t=600 s, Y holds 2 until t=1200 s.
    queue = [Queued("j1", Need(A, 4, 1800)), Queued("j2", Need(A, 2, 300)),
             Queued("j3", Need(A, 16, 60)), Queued("j4", Need("L40S", 1, 60)),
             Queued("j5", None), Queued("j6", Need(A, 8, 100))]
    got = explain_queue(queue, free={A: 2, "L40S": 4}, total={A: 8, "L40S": 4},
                        holding=[Holding(A, 4, 600), Holding(A, 2, 1200)])
    # j1: 2 free < 4; X ends at 600 → 6 free → starts at 600 (10 min)
    assert got["j1"].kind is WaitKind.WAITING_FOR_GPUS
    assert got["j1"].message == ("needs 4×A100-80G, 2 free; earliest start ≈ 10 min by the "
                                 "plans' predicted times")
    assert (got["j1"].gpus_free, got["j1"].gpus_total, got["j1"].jobs_ahead) == (2, 8, 0)
    # j2: 2 free would do, but j1 is ahead; not before j1 (600) and the 2 left then fit
    assert got["j2"].kind is WaitKind.BEHIND_QUEUE and got["j2"].jobs_ahead == 1
    assert got["j2"].earliest_start_s == 600
    assert "1 job ahead" in got["j2"].message
    # j3: 16 > 8 at all
    assert got["j3"].kind is WaitKind.LARGER_THAN_CLUSTER
    assert got["j3"].message == "needs 16×A100-80G; the cluster has 8"
    assert got["j3"].earliest_start_s is None
    # j4: other type, free, nobody ahead
    assert got["j4"].kind is WaitKind.NEXT_ROUND and got["j4"].earliest_start_s == 0
    assert got["j5"].kind is WaitKind.NO_PLAN
    # j6: all 8; releases after 600: j2 at 900 (2), Y at 1200 (2), j1 at 2400 (4) → 2400 s
    assert got["j6"].kind is WaitKind.WAITING_FOR_GPUS and got["j6"].jobs_ahead == 2
    assert got["j6"].earliest_start_s == 2400
    assert got["j6"].message.endswith("2 jobs ahead; earliest start ≈ 40 min by the plans' "
                                      "predicted times")


def test_a_type_with_nothing_to_release_has_no_estimate() -> None:
    got = explain_queue([Queued("j", Need(A, 4, 10))], free={A: 2}, total={A: 8}, holding=[])
    assert got["j"].kind is WaitKind.WAITING_FOR_GPUS and got["j"].earliest_start_s is None
    assert got["j"].message == "needs 4×A100-80G, 2 free"


def test_api_waiting_block_and_the_queue(env) -> None:  # type: ignore[no-untyped-def]
    from service_builders import job_body

    first = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    second = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    w1 = env.client.get(f"/v1/jobs/{first['id']}", headers=env.headers("alice")).json()["waiting"]
    w2 = env.client.get(f"/v1/jobs/{second['id']}",
                        headers=env.headers("alice")).json()["waiting"]
    best = first["plans"][0]
    # the test cluster: 2 nodes × 8 A100-80G, 1 × 4 L40S, nothing held (the runner is idle)
    total = {"A100-80G": 16, "L40S": 4}[best["gpu_type"]]
    assert w1 == {"kind": "next_round", "gpu_type": best["gpu_type"],
                  "gpus_needed": best["num_gpus"], "gpus_free": total, "gpus_total": total,
                  "jobs_ahead": 0, "earliest_start_s": 0.0,
                  "message": f"needs {best['num_gpus']}×{best['gpu_type']}, {total} free; "
                             "starts at the scheduler's next round"}
    # the second fits beside the first when twice its GPUs are there, else waits behind it
    fits_both = 2 * best["num_gpus"] <= total
    assert w2["jobs_ahead"] == 1
    assert w2["kind"] == ("next_round" if fits_both else "behind_queue")
    mine = env.client.get("/v1/cluster/queue", headers=env.headers("alice")).json()["data"]
    assert [(e["position"], e["job_id"]) for e in mine] == [(1, first["id"]), (2, second["id"])]
    theirs = env.client.get("/v1/cluster/queue", headers=env.headers("bob")).json()["data"]
    assert [e["job_id"] for e in theirs] == [None, None]  # bob sees the queue, not alice's ids
    assert theirs[1]["waiting"] == w2


def test_frenzy_status_shows_the_queue_and_jobs_id_the_reason(
        env, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    import contextlib

    from service_builders import job_body

    from service import serve_cli
    from service.cli import main as cli_main

    job = env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice")).json()
    env.client.headers.update(env.headers("bob"))
    monkeypatch.setattr(serve_cli, "_client", lambda: contextlib.nullcontext(env.client))
    assert cli_main(["status"]) == 0
    out = capsys.readouterr().out
    assert "queue: 1 job\n" in out and "1. (another user) [next_round] needs " in out
    env.client.headers.update(env.headers("alice"))
    assert cli_main(["status"]) == 0
    assert f"1. {job['id'][:8]}   [next_round]" in capsys.readouterr().out
    assert cli_main(["jobs", job["id"]]) == 0
    assert "  waiting   [next_round] needs " in capsys.readouterr().out


def test_the_queue_explanation_is_shared_for_ttl_s_and_plans_are_decoded_once(
        env, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Many GETs of waiting jobs in one second work the queue out once; a stored job's
    plans are read once for as long as it lives, and each distinct plans document is
    decoded once."""
    from service_builders import job_body

    from service import queue_view

    for _ in range(3):
        env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice"))
    now = [100.0]
    provider = env.client.app.state.ctx.cluster_provider
    calls = {"queue": 0, "decoded": 0, "cluster": 0}

    def counting_cluster():  # type: ignore[no-untyped-def]
        calls["cluster"] += 1
        return provider()

    cache = queue_view.QueueCache(env.factory, counting_cluster, ttl_s=1.0,
                                  clock=lambda: now[0])
    real_queue_of, real_summarise = queue_view.queue_of, queue_view.summarise

    def counting_queue_of(*a, **k):  # type: ignore[no-untyped-def]
        calls["queue"] += 1
        return real_queue_of(*a, **k)

    def counting_summarise(plans):  # type: ignore[no-untyped-def]
        calls["decoded"] += 1
        return real_summarise(plans)

    monkeypatch.setattr(queue_view, "queue_of", counting_queue_of)
    monkeypatch.setattr(queue_view, "summarise", counting_summarise)
    queue_view.summarise_text.cache_clear()  # documents other tests decoded
    assert cache.peek() is None  # nothing worked out yet: a caller must ``get``
    queued, reasons = cache.get()
    assert len(queued) == 3 and set(reasons) == {j.id for j in queued}
    assert cache.peek() == (queued, reasons)
    for _ in range(5):
        now[0] += 0.1
        assert cache.get()[1] is reasons  # within the second: the same answer
    # the cluster is read only when the queue is worked out, not per request
    # three identical submissions store one plans document: decoded once
    assert calls == {"queue": 1, "decoded": 1, "cluster": 1}
    now[0] += 1.0
    assert cache.peek() is None  # stale: peeking works nothing out
    assert calls["queue"] == 1
    cache.get()
    assert calls == {"queue": 2, "decoded": 1, "cluster": 2}  # no plan decoded again


def test_a_costly_queue_explanation_stays_fresh_longer(env) -> None:  # type: ignore[no-untyped-def]
    """Working the queue out took 0.3 s (on the stand-in clock): at most 5 % of the time
    goes to it, so it stays fresh for 0.3 / 0.05 = 6 s, not ttl_s = 1 s; a cheap one
    again for ttl_s."""
    from service_builders import job_body

    from service import queue_view

    env.client.post("/v1/jobs", json=job_body(), headers=env.headers("alice"))
    provider = env.client.app.state.ctx.cluster_provider
    now, cost, reads = [100.0], [0.3], [0]

    def slow_cluster():  # type: ignore[no-untyped-def]
        reads[0] += 1
        now[0] += cost[0]
        return provider()

    cache = queue_view.QueueCache(env.factory, slow_cluster, ttl_s=1.0,
                                  clock=lambda: now[0], max_share=0.05)
    cache.get()
    now[0] += 5.9
    cache.get()
    assert reads == [1]  # 5.9 s after: still fresh
    now[0] += 0.2
    cost[0] = 0.0
    cache.get()
    assert reads == [2]  # 6.1 s after: worked out again, this time at no cost
    now[0] += 1.1
    cache.get()
    assert reads == [3]  # fresh for ttl_s again
    with pytest.raises(ValueError, match="max_share"):
        queue_view.QueueCache(env.factory, slow_cluster, max_share=0.0)


def test_a_stored_plans_document_summarised_from_its_text() -> None:
    from service import queue_view

    doc = ('[{"gpu_type": "A100-80G", "num_gpus": 2, "step_time_s": 0.5, "tp": 2},'
           ' {"gpu_type": "H100", "num_gpus": 1, "step_time_s": null}]')
    assert queue_view.summarise_text(doc) == (("A100-80G", 2, 0.5), ("H100", 1, 0.0))
    assert queue_view.summarise_text(doc) is queue_view.summarise_text(doc[:] + "")
    assert queue_view.summarise_text(None) == () == queue_view.summarise_text("null")


def test_best_plan_by_hand_and_the_shared_search() -> None:
    from service import queue_view

    plans = (("H100", 16, 1.0), ("A100", 2, 2.0), ("A100", 1, 3.0))
    assert queue_view.best_plan(plans, {"A100": 4}) == ("A100", 2, 2.0)
    assert queue_view.best_plan(plans, {"A100": 1}) == ("A100", 1, 3.0)  # 2 GPUs do not fit
    assert queue_view.best_plan(plans, {"H100": 8}) == ("H100", 16, 1.0)  # larger than it
    assert queue_view.best_plan(plans, {"V100": 8}) is None
    job = type("J", (), {"total_steps": 10, "steps_done": 4.0})()
    chosen: dict[int, tuple[str, int, float] | None] = {}
    need = queue_view.best_need(job, plans, {"A100": 4}, chosen)
    assert need == Need("A100", 2, 6 * 2.0) == queue_view.best_need(job, plans, {"A100": 4})
    assert chosen == {id(plans): ("A100", 2, 2.0)}
    assert queue_view.best_need(job, plans, {"A100": 4}, chosen) == need  # from ``chosen``
