"""predictor/ and scheduler/ are pure cores: no HTTP, SQL, Ray or service imports; the
orchestrator (the control loop and its backends) sits below the simulator and the service:
the service is one of its job sources and listeners, not something it depends on (AST checks)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {"fastapi", "sqlalchemy", "ray", "service", "orchestrator", "httpx", "uvicorn",
             "starlette", "alembic", "requests"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize("package", ["predictor", "scheduler"])
def test_core_is_pure(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & FORBIDDEN) for f in files}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"impure imports: {bad}"


def test_orchestrator_imports_neither_simulator_nor_service() -> None:
    above = {"simulator", "service", "benchmarks"}
    files = sorted((ROOT / "orchestrator").rglob("*.py"))
    assert files, "orchestrator/ has no modules"
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & above) for f in files}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"the orchestrator imports from above it: {bad}"


ORCHESTRATOR_FORBIDDEN = {"service", "fastapi", "sqlalchemy", "alembic", "uvicorn",
                          "starlette", "httpx"}


def test_orchestrator_does_not_import_the_service() -> None:
    files = sorted((ROOT / "orchestrator").rglob("*.py"))
    assert any(f.name == "loop.py" for f in files)
    bad = {str(f.relative_to(ROOT)): sorted(_imports(f) & ORCHESTRATOR_FORBIDDEN)
           for f in files}
    bad = {k: v for k, v in bad.items() if v}
    assert not bad, f"orchestrator imports the service side: {bad}"


def test_checker_catches_a_violation(tmp_path: Path) -> None:
    f = tmp_path / "m.py"
    f.write_text("import ray\nfrom sqlalchemy.orm import Session\nfrom . import x\n")
    assert _imports(f) & FORBIDDEN == {"ray", "sqlalchemy"}
