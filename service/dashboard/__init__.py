"""The dashboard: static pages served by the API (``/`` and ``/jobs/{id}``).

Self-contained (no CDN: the pages must work on a closed network): plain HTML, CSS and one
script that reads the REST API with the user's token and draws the cluster grid, the queue,
running jobs with progress, utilisation over time by GPU type and each job's ranked plans
with their memory breakdown as inline SVG. The token comes from the page's URL fragment
(``/#token=...``, never sent to the server) or the browser's local storage.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

STATIC_DIR = Path(__file__).resolve().parent / "static"


def install_dashboard(app: FastAPI) -> None:
    """Serve the dashboard at ``/``, the job page at ``/jobs/{id}``, assets under
    ``/dashboard/``."""
    app.mount("/dashboard", StaticFiles(directory=STATIC_DIR), name="dashboard")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/jobs/{job_id}", include_in_schema=False)
    def job_page(job_id: str) -> FileResponse:
        return FileResponse(STATIC_DIR / "job.html", headers={"Cache-Control": "no-cache"})
