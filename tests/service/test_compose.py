"""docker-compose.yml is checked statically (no Docker engine runs here): it parses, has the
services a real deployment needs, and every command it runs exists in this project."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import yaml

from predictor.gpus import load_gpu_catalog
from service.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _argv(service: dict) -> list[str]:
    cmd = service.get("command")
    return shlex.split(cmd) if isinstance(cmd, str) else [str(c) for c in cmd]


def test_services_and_dependencies(compose: dict) -> None:
    services = compose["services"]
    assert {"postgres", "migrate", "ray-head", "api"} <= set(services)
    workers = [n for n in services if n.startswith("worker-")]
    assert len(workers) >= 2
    api = services["api"]
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["environment"]["DATABASE_URL"].startswith("postgresql+psycopg://")
    assert api["environment"]["RAY_ADDRESS"].startswith("ray-head:")
    for name, svc in services.items():
        build = svc.get("build")
        if build:
            assert (ROOT / build["context"] / build["dockerfile"]).exists(), name


def test_every_command_exists(compose: dict) -> None:
    parser = build_parser()
    catalog = load_gpu_catalog()
    for name, svc in compose["services"].items():
        if "command" not in svc:
            assert "image" in svc and "build" not in svc, f"{name}: no command"
            continue
        argv = _argv(svc)
        prog, args = argv[0], argv[1:]
        if prog == "frenzy":
            ns = parser.parse_args(args)  # SystemExit on an unknown sub-command or flag
            assert callable(ns.handler), name
        elif prog == "alembic":
            assert args[:2] == ["-c", "alembic.ini"] and (ROOT / "alembic.ini").exists()
            assert (ROOT / "migrations" / "env.py").exists() and "upgrade" in args
        elif prog == "ray":
            assert args[0] == "start", name
            from ray.scripts.scripts import start

            opts = {o for p in start.params for o in p.opts}
            for a in args[1:]:
                assert a.split("=")[0] in opts, f"{name}: ray start has no {a}"
            labels = [a.split("=", 1)[1] for a in args if a.startswith("--labels=")]
            for spec in labels:
                kv = dict(item.split("=", 1) for item in spec.split(","))
                assert kv["frenzy.io/gpu-type"] in catalog, f"{name}: unknown GPU type"
        else:
            pytest.fail(f"{name}: command {prog!r} is not part of the project")


def test_dockerfile_copies_existing_paths() -> None:
    for line in (ROOT / "docker" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and not line.startswith("COPY --from="):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), src
