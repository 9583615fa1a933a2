"""The REST API (FastAPI): ``create_app`` builds it; routes live in ``service.api.routes``."""

from service.api.app import create_app

__all__ = ["create_app"]
