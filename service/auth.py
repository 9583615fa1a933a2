"""API tokens: created once (shown to the user a single time), stored only as SHA-256.

A token is ``frz_`` + 43 URL-safe characters (256 random bits), so a plain SHA-256 is enough
(no salt or slow hash is needed for a random secret of that size) and lets verification be
one indexed lookup. ``Principal`` is what the API knows about the caller afterwards.

A token may carry an expiry (``frenzy token create --expires-in 7d``) and is revoked one at
a time (``frenzy token revoke ID``) or per owner. The API looks the token up on every
request (no cache), so a revocation or an expiry takes effect on the next request.

``write_private_file`` writes a secret (the local admin's token file) so that it is never
readable by others, not even for an instant: the temporary file is created 0600 and then
renamed over the target.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import re
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy.orm import Session

from service.db import repositories as repo
from service.db.models import utcnow
from service.limits import text_problem

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
    expires_in: timedelta | None = None,
) -> str:
    """Make and store a token for ``owner`` (valid for ``expires_in`` if given); returns
    the plain token (not committed)."""
    owner = owner.strip()
    if not owner or len(owner) > 64:
        raise ValueError("owner: must be 1-64 characters")
    for field, value in (("owner", owner), ("label", label or "")):
        if (problem := text_problem(value)) is not None:
            raise ValueError(f"{field}: {problem}")
    if expires_in is not None and expires_in <= timedelta(0):
        raise ValueError("expires_in: must be positive")
    now = now or utcnow()
    token = generate_token()
    repo.add_token(
        session=session, owner=owner, token_hash=hash_token(token), is_admin=is_admin,
        label=label, now=now, expires_at=now + expires_in if expires_in else None,
    )
    log.info("created %s token for %s", "admin" if is_admin else "user", owner)
    return token


def plausible_token(token: str) -> bool:
    """Whether ``token`` has a token's shape (else no lookup is worth making)."""
    return token.startswith(TOKEN_PREFIX) and len(token) <= 200


def verify_token(
    *, session: Session, token: str, now: datetime | None = None
) -> Principal | None:
    """The principal a presented token belongs to, or None if unknown, revoked or expired
    at ``now``."""
    if not plausible_token(token):
        return None
    row = repo.get_active_token(session=session, token_hash=hash_token(token), now=now)
    if row is None:
        return None
    return Principal(owner=row.owner, is_admin=bool(row.is_admin), token_id=int(row.id))


_DURATION = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_duration(text: str) -> timedelta:
    """``30m``, ``12h``, ``7d``, ``2w`` (or seconds: ``3600s``) as a ``timedelta``;
    ``ValueError`` saying what would fit otherwise."""
    m = _DURATION.match(text)
    if m is None or int(m.group(1)) == 0:
        raise ValueError(
            f"{text!r} is not a duration; write a positive whole number and a unit "
            "(s, m, h, d, w), e.g. 30m, 12h, 7d")
    seconds = int(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds > 100 * 365 * 86400:
        raise ValueError(f"{text!r} is longer than 100 years")
    return timedelta(seconds=seconds)


def write_private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` readable and writable by its owner only (0600), atomically:
    a temporary file created with mode 0600 (``O_EXCL``, never with the umask's wider
    default) is filled, synced and renamed over ``path``. Its folder is created 0700 if
    missing."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600)  # whatever the umask
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
