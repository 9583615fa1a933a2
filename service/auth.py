"""API tokens: created once (shown to the user a single time), stored only as SHA-256.

A token is ``frz_`` + 43 URL-safe characters (256 random bits), so a plain SHA-256 is enough
(no salt or slow hash is needed for a random secret of that size) and lets verification be
one indexed lookup. ``Principal`` is what the API knows about the caller afterwards.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from service.db import repositories as repo

log = logging.getLogger(__name__)

TOKEN_PREFIX = "frz_"


@dataclass(frozen=True, slots=True)
class Principal:
    """The authenticated caller: who owns what they submit, and whether they are an admin."""

    owner: str
    is_admin: bool
    token_id: int

    def can_see(self, owner: str) -> bool:
        return self.is_admin or hmac.compare_digest(self.owner, owner)


def generate_token() -> str:
    """A new random API token (the only time the plain value exists)."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_token(token: str) -> str:
    """Hex SHA-256 of the token: what the database stores and looks up."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def create_token(
    *,
    session: Session,
    owner: str,
    is_admin: bool = False,
    label: str | None = None,
    now: datetime | None = None,
) -> str:
    """Make and store a token for ``owner``; returns the plain token (not committed)."""
    owner = owner.strip()
    if not owner or len(owner) > 64:
        raise ValueError("owner: must be 1-64 characters")
    token = generate_token()
    repo.add_token(
        session=session, owner=owner, token_hash=hash_token(token), is_admin=is_admin,
        label=label, now=now,
    )
    log.info("created %s token for %s", "admin" if is_admin else "user", owner)
    return token


def verify_token(*, session: Session, token: str) -> Principal | None:
    """The principal a presented token belongs to, or None if unknown or revoked."""
    if not token.startswith(TOKEN_PREFIX) or len(token) > 200:
        return None
    row = repo.get_active_token(session=session, token_hash=hash_token(token))
    if row is None:
        return None
    return Principal(owner=row.owner, is_admin=row.is_admin, token_id=row.id)
