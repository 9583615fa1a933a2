"""``/docs`` (Swagger UI) served from this process, so it works on a closed network.

FastAPI's own ``/docs`` page loads the Swagger UI script and stylesheet from a public CDN;
here they come from the ``swagger-ui-bundle`` package (a release of Swagger UI as package
data), mounted under ``/docs-assets``. ReDoc, which FastAPI also loads from a CDN, is off.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

log = logging.getLogger(__name__)

ASSETS = "/docs-assets"


def install_docs(app: FastAPI, *, openapi_url: str = "/openapi.json") -> None:
    """Serve ``/docs`` with the packaged Swagger UI assets (``app`` must be built with
    ``docs_url=None``). Without the package the page falls back to FastAPI's CDN links."""
    try:
        from swagger_ui_bundle import swagger_ui_path
    except ImportError:  # pragma: no cover - a dependency of the project
        log.warning("swagger-ui-bundle not installed: /docs loads Swagger UI from its CDN")
        swagger_ui_path = None
    if swagger_ui_path is not None:
        app.mount(ASSETS, StaticFiles(directory=swagger_ui_path), name="docs-assets")
    assets = (
        {"swagger_js_url": f"{ASSETS}/swagger-ui-bundle.js",
         "swagger_css_url": f"{ASSETS}/swagger-ui.css",
         "swagger_favicon_url": f"{ASSETS}/favicon-32x32.png"}
        if swagger_ui_path is not None else {})

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=openapi_url, title=f"{app.title} - API",
                                   **assets)
