"""The RayBackend's warm worker pool on the emulated 2-node cluster (2×A100-80G +
1×A100-40G): built-in-trainer jobs run on the pool's long-lived workers, a later job on the
same GPUs reuses the same processes, each still on the node the policy chose and on a GPU of
its own; a cancelled job's workers are replaced by fresh ones; a reused worker carries
nothing of the previous job; entrypoint jobs keep actors of their own; nothing leaks."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray

from orchestrator.ray_backend import (
    NODE_ID_LABEL,
    gpus_in_use,
    live_placement_groups,
    wait_released,
)
from orchestrator.sandbox import job_python
from orchestrator.states import JobState
from tests.orchestrator.test_ray_backend import Rig, cluster  # noqa: F401 (fixture)

pytestmark = pytest.mark.ray


@pytest.fixture
def rig(cluster, tmp_path: Path) -> Iterator[Rig]:  # noqa: F811
    r = Rig(tmp_path, checkpoint_every=2, warm_pool=True)
    try:
        assert r.backend.wait_warm(180), "the pool's workers did not come up"
        yield r
    finally:
        r.close()
        assert wait_released(10), f"leaked: {gpus_in_use()} GPUs, {live_placement_groups()}"


def _pool_pids(rig: Rig) -> dict[tuple[str, int], int | None]:
    pool = rig.backend.pool
    assert pool is not None
    return {(s.node, s.index): s.pid for node in ("big", "small") for s in pool.slots(node)}


def _placed(rig: Rig, job_id: str) -> dict[str, int]:
    placed = next(e for e in rig.events if e.job_id == job_id and e.to_state is JobState.PLACED)
    assert placed.allocation is not None
    return dict(placed.allocation.placement)


def _seen(rig: Rig, job_id: str) -> dict[str, int]:
    seen: dict[str, int] = {}
    for w in rig.backend.placements[job_id]:  # reported from inside each actor
        seen[w["labels"][NODE_ID_LABEL]] = seen.get(w["labels"][NODE_ID_LABEL], 0) + 1
    return seen


def test_a_second_job_reuses_the_warm_workers_on_its_nodes(rig: Rig) -> None:
    warm = _pool_pids(rig)
    assert len(warm) == 3 and all(warm.values())  # one worker per GPU, all up
    for job_id in ("a", "b"):
        rig.submit(rig.job(job_id, gpus=2, steps=4))
        rig.wait(job_id, lambda r: r.state.terminal)
        assert rig.controller.job(job_id).state is JobState.SUCCEEDED
        assert _seen(rig, job_id) == _placed(rig, job_id)  # on the nodes the policy chose
        workers = rig.backend.placements[job_id]
        assert len({w["cuda_visible_devices"] for w in workers}) == 2  # a GPU each
        assert {w["pid"] for w in workers} <= set(warm.values())  # pool processes
        assert len(rig.backend.losses[job_id]) == 4
    a = {w["rank"]: w for w in rig.backend.placements["a"]}
    b = {w["rank"]: w for w in rig.backend.placements["b"]}
    # a 2-GPU job goes to the node with 2 GPUs (as in test_ray_backend): the same GPUs,
    # so the very same processes, each having run a's rank before b's
    assert _placed(rig, "a") == _placed(rig, "b") == {"big": 2}
    assert {w["pid"] for w in a.values()} == {w["pid"] for w in b.values()}
    assert all(w["jobs_run"] == 1 for w in b.values())
    pool = rig.backend.pool
    assert pool is not None and pool.started == 3  # no process started for either job
    assert pool.reused == 2
    assert _pool_pids(rig) == warm
    assert wait_released(10)
    assert rig.controller.cluster.free_gpus == rig.controller.cluster.total_gpus


def test_a_cancelled_jobs_worker_is_replaced_and_a_reused_one_is_clean(rig: Rig) -> None:
    warm = _pool_pids(rig)
    rig.submit(rig.job("c", gpus=1, steps=100_000))
    rig.wait("c", lambda r: r.state is JobState.RUNNING)
    assert gpus_in_use() == 1  # the job's placement group holds its GPU, the pool none
    c_pid = rig.backend.placements["c"][0]["pid"]
    rig.source.cancel("c")
    rig.loop.wake()
    rig.wait("c", lambda r: r.state is JobState.CANCELLED, timeout=30)
    assert rig.loop.wait_until(lambda c: rig.backend.wait_warm(0), 120)
    now = _pool_pids(rig)
    assert c_pid not in now.values()  # killed, as without the pool, and replaced
    assert sum(now[k] != warm[k] for k in warm) == 1

    # what a job could leave in a process: variables, a working directory
    def pollute(worker: object) -> None:
        os.environ["JOB_A_SECRET"] = "a"
        os.chdir("/tmp")

    def leftovers(worker: object) -> tuple[str | None, str]:
        return os.environ.get("JOB_A_SECRET"), os.getcwd()

    pool = rig.backend.pool
    assert pool is not None
    actors = {s.pid: s.actor for node in ("big", "small") for s in pool.slots(node)}
    before = {pid: ray.get(a.__ray_call__.remote(leftovers))[1] for pid, a in actors.items()}
    ray.get([a.__ray_call__.remote(pollute) for a in actors.values()])
    rig.submit(rig.job("d", gpus=2, steps=2))
    rig.wait("d", lambda r: r.state.terminal)
    assert rig.controller.job("d").state is JobState.SUCCEEDED
    for w in rig.backend.placements["d"]:
        secret, cwd = ray.get(actors[w["pid"]].__ray_call__.remote(leftovers))
        assert secret is None and cwd == before[w["pid"]] != "/tmp"


def test_an_entrypoint_job_gets_fresh_actors_on_gpus_of_its_own(rig: Rig,
                                                                tmp_path: Path) -> None:
    script = ("import os, json, pathlib\n"
              "d = pathlib.Path(os.environ['FRENZY_CHECKPOINT_DIR'])\n"
              "(d / f\"env-{os.environ['RANK']}.json\").write_text(json.dumps("
              "{'cvd': os.environ.get('CUDA_VISIBLE_DEVICES')}))\n"
              "print('frenzy step=1 loss=1.5', flush=True)\n")
    warm = _pool_pids(rig)
    job = rig.job("e", gpus=2, steps=1)
    job.extra["entrypoint"] = [job_python(), "-c", script]
    rig.submit(job)
    rig.wait("e", lambda r: r.state.terminal)
    assert rig.controller.job("e").state is JobState.SUCCEEDED
    assert _seen(rig, "e") == _placed(rig, "e")
    envs = [json.loads((tmp_path / "e" / f"env-{r}.json").read_text()) for r in (0, 1)]
    assert len({e["cvd"] for e in envs}) == 2 and all(e["cvd"] for e in envs)
    assert not {w["pid"] for w in rig.backend.placements["e"]} & set(warm.values())
    assert _pool_pids(rig) == warm  # the slots' warm workers were left alone


def test_a_warm_worker_found_dead_is_replaced_without_a_restart(rig: Rig) -> None:
    pool = rig.backend.pool
    assert pool is not None
    warm = _pool_pids(rig)
    for node in ("big", "small"):  # every idle worker dies (say, the OOM killer)
        for s in pool.slots(node):
            ray.kill(s.actor, no_restart=True)
    rig.submit(rig.job("f", gpus=1, steps=2))
    rig.wait("f", lambda r: r.state.terminal)
    rec = rig.controller.job("f")
    assert rec.state is JobState.SUCCEEDED and rec.view.restarts == 0
    assert rig.states("f").count(JobState.PENDING) == 1  # queued once, at submission
    (w,) = rig.backend.placements["f"]
    assert w["pid"] not in warm.values()  # a fresh worker, on the node the policy chose
    assert _seen(rig, "f") == _placed(rig, "f")
    assert pool.started == 4  # the three first ones and the one replacement
