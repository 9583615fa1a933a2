"""CLI habits: a short id prefix (what the dashboard and `frenzy jobs` show) works wherever a
job id is taken; an ambiguous one is refused listing the candidates; lists show names."""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from service_builders import Env, job_body

from service import serve_cli
from service.serve_cli import ClientError, resolve_job_id

IDS = ["abc10000000000000000000000000001", "abc20000000000000000000000000002",
       "def00000000000000000000000000003"]


def _fake_pages(monkeypatch: pytest.MonkeyPatch, page: int = 2) -> list[dict[str, Any]]:
    """A service with the jobs IDS, answered ``page`` at a time (the prefix search pages)."""
    jobs = [{"id": i, "name": f"run-{n}", "state": "RUNNING"} for n, i in enumerate(IDS)]
    asked: list[dict[str, Any]] = []

    def call(method: str, path: str, **kw: Any) -> Any:
        assert (method, path) == ("GET", "/v1/jobs")
        params = kw["params"]
        asked.append(params)
        start = params["offset"]
        return {"data": jobs[start:start + page], "count": len(jobs)}

    monkeypatch.setattr(serve_cli, "PREFIX_PAGE", page)
    monkeypatch.setattr(serve_cli, "_call", call)
    return asked


def test_a_unique_prefix_resolves_across_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = _fake_pages(monkeypatch)
    assert resolve_job_id("def") == IDS[2]  # on the second page
    assert [a["offset"] for a in asked] == [0, 2]
    assert resolve_job_id("abc2") == IDS[1]
    assert resolve_job_id(IDS[0]) == IDS[0]  # a full id: no search
    assert resolve_job_id("zzz") == "zzz"  # no match: the service's 404 says so


def test_an_ambiguous_prefix_lists_the_candidates(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_pages(monkeypatch)
    with pytest.raises(ClientError) as err:
        resolve_job_id("abc")
    text = str(err.value)
    assert "'abc' is ambiguous: 2 jobs match" in text
    assert f"{IDS[0]}  run-0" in text and f"{IDS[1]}  run-1" in text and IDS[2] not in text


def _service_call(env: Env, who: str = "alice"):  # type: ignore[no-untyped-def]
    def call(method: str, path: str, **kw: Any) -> Any:
        r = env.client.request(method, path, headers=env.headers(who), **kw)
        if r.status_code >= 400:
            raise ClientError(f"{r.status_code}: {r.json().get('detail', r.text)}")
        return r.json()
    return call


def test_jobs_show_and_cancel_take_a_prefix_and_the_list_shows_names(
        env: Env, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    r = env.client.post("/v1/jobs", json=job_body(name="my-run"), headers=env.headers("alice"))
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    monkeypatch.setattr(serve_cli, "_call", _service_call(env))
    ns = argparse.Namespace
    assert serve_cli.run_jobs(ns(job_id=None, id=None, state=None, limit=50, json=False)) == 0
    listing = capsys.readouterr().out.splitlines()
    assert listing[0].split()[:4] == ["id", "name", "owner", "model"]
    assert listing[1].split()[:2] == [job_id[:8], "my-run"]
    assert serve_cli.run_jobs(ns(job_id=job_id[:8], id=None, json=True, state=None,
                                 limit=50)) == 0
    assert f'"id": "{job_id}"' in capsys.readouterr().out
    assert serve_cli.run_cancel(ns(job_id=job_id[:6], reason=None)) == 0
    assert capsys.readouterr().out.startswith(f"{job_id}  cancelled")
