"""Alembic revisions (frozen; see migrations/env.py)."""
