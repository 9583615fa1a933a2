"""What a user can learn about others: nothing by job id (a 404, as for an id that does
not exist), no job ids on ``/v1/cluster``; ``/metrics`` only with an admin token.

Findings (issue 15): 403 vs 404 confirmed which ids exist; ``/v1/cluster`` showed every
user's job ids; ``/metrics`` needed no token."""

from __future__ import annotations

from security_helpers import Env

from orchestrator.states import JobState
from service.db import repositories as repo
from service.db.engine import write_session


def _place(env: Env, job_id: str, node: str, gpus: int) -> None:
    with write_session(env.factory) as s:
        job = repo.get_job(session=s, job_id=job_id, for_update=True)
        assert job is not None
        repo.set_allocation(session=s, job=job, placement=[(node, gpus)],
                            gpu_type="A100-80G", plan_rank=1, now=env.clock())
        repo.transition_job(session=s, job=job, to=JobState.PLACED, reason="t",
                            now=env.clock())


def test_another_users_job_is_a_404_like_an_unknown_one(env: Env) -> None:
    job_id = env.submit("alice")
    unknown = "0" * 32
    for method, suffix in (("get", ""), ("get", "/events"), ("post", "/cancel")):
        theirs = env.client.request(method, f"/v1/jobs/{job_id}{suffix}",
                                    headers=env.headers("bob"))
        missing = env.client.request(method, f"/v1/jobs/{unknown}{suffix}",
                                     headers=env.headers("bob"))
        assert theirs.status_code == missing.status_code == 404, suffix
        assert theirs.json()["detail"] == f"job_id: no job {job_id!r} of yours"
        assert missing.json()["detail"] == f"job_id: no job {unknown!r} of yours"
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.headers("alice")).json()[
        "state"] == "pending"  # bob's cancel did nothing
    assert env.client.get(f"/v1/jobs/{job_id}", headers=env.headers("admin")).status_code == 200


def test_cluster_shows_a_user_only_their_own_job_ids(env: Env) -> None:
    mine, theirs = env.submit("bob"), env.submit("alice")
    _place(env, mine, "a100-0", 2)
    _place(env, theirs, "a100-1", 4)
    bob = env.client.get("/v1/cluster", headers=env.headers("bob")).json()
    nodes = {n["id"]: n for n in bob["nodes"]}
    assert nodes["a100-0"]["holders"] == [{"job_id": mine, "gpus": 2}]
    assert nodes["a100-1"]["holders"] == [{"job_id": None, "gpus": 4}]  # occupancy, no id
    assert nodes["a100-1"]["free_gpus"] == 4 and bob["used_gpus"] == 6
    assert [p["job_id"] for p in bob["jobs"]] == [mine]
    assert theirs not in str(bob)
    admin = env.client.get("/v1/cluster", headers=env.headers("admin")).json()
    assert sorted(p["job_id"] for p in admin["jobs"]) == sorted([mine, theirs])


def test_metrics_need_an_admin_token(env: Env) -> None:
    r = env.client.get("/metrics")
    assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer"
    assert env.client.get("/metrics", headers=env.headers("alice")).status_code == 403
    r = env.client.get("/metrics", headers=env.headers("admin"))
    assert r.status_code == 200 and "frenzy_queue_length 0" in r.text
