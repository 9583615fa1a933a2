"""``frenzy token create|list|revoke``: make an API token and print it once, list tokens,
revoke one (by id) or all of an owner's.

``add_token_parser`` / ``run_token`` are wired into the ``frenzy`` console script by
``service.cli``. The token is written to stdout (the only place it ever appears; its id and
expiry go to stderr); only its SHA-256 is stored. ``--expires-in 7d`` makes it stop working
after that long. The database is brought to the latest migration first, so this works on a
fresh install.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import datetime

from sqlalchemy.orm import Session

from service.auth import create_token, hash_token, parse_duration
from service.db import repositories as repo
from service.db.engine import make_engine, make_session_factory, migrate, write_session
from service.db.models import Token
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def add_token_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``token`` (``create``, ``list``, ``revoke``) to a ``frenzy`` subparsers object."""
    parser = subparsers.add_parser("token", help="manage API tokens")
    actions = parser.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument("--owner", required=True, help="user name the token acts as")
    create.add_argument("--admin", action="store_true", help="may use the admin endpoints")
    create.add_argument("--label", default=None, help="a note to recognise the token by")
    create.add_argument("--expires-in", default=None, metavar="DURATION",
                        help="stop working after this long: 30m, 12h, 7d, 2w (default: never)")
    listing = actions.add_parser("list", help="list tokens: id, owner, expiry, revocation")
    listing.add_argument("--owner", default=None, help="only this owner's")
    revoke = actions.add_parser("revoke", help="revoke one token by id, or all of an owner's")
    revoke.add_argument("token_id", nargs="?", type=int, default=None,
                        help="the id shown by 'frenzy token list' (or at creation)")
    revoke.add_argument("--owner", default=None, help="revoke every token of this owner")
    for p in (create, listing, revoke):
        p.add_argument("--database-url", default=None, help="default: DATABASE_URL")
        p.add_argument("--no-migrate", action="store_true",
                       help="do not bring the schema to the latest migration first")
    parser.set_defaults(handler=run_token)
    return parser


def run_token(args: argparse.Namespace, settings: Settings | None = None) -> int:
    """Run ``frenzy token ...``; returns the process exit code."""
    settings = settings or get_settings()
    url = args.database_url or settings.database_url
    if args.database_url:
        url = Settings(database_url=url).database_url  # same normalisation as the service
    if not args.no_migrate:
        migrate(url)
    engine = make_engine(url, busy_timeout_ms=settings.sqlite_busy_timeout_ms)
    try:
        factory = make_session_factory(engine)
        with write_session(factory) as session:
            if args.token_command == "create":
                return _create(session, args)
            if args.token_command == "list":
                return _list(session, args)
            return _revoke(session, args)
    finally:
        engine.dispose()


def _create(session: Session, args: argparse.Namespace) -> int:
    try:
        expires_in = parse_duration(args.expires_in) if args.expires_in else None
        token = create_token(
            session=session, owner=args.owner, is_admin=args.admin, label=args.label,
            expires_in=expires_in,
        )
    except ValueError as exc:
        field = "--expires-in" if args.expires_in and "duration" in str(exc) else ""
        sys.stderr.write(f"error: {field + ': ' if field else ''}{exc}\n")
        return 2
    row = repo.get_active_token(session=session, token_hash=hash_token(token))
    assert row is not None
    stored = session.get(Token, row.id)
    until = stored.expires_at.isoformat() if stored and stored.expires_at else "never"
    sys.stderr.write(f"token {row.id} for {row.owner}; expires: {until}\n")
    sys.stdout.write(token + "\n")
    return 0


def _list(session: Session, args: argparse.Namespace) -> int:
    rows = repo.list_tokens(session=session, owner=args.owner)
    sys.stdout.write(f"{'id':>5}  {'owner':16} {'admin':5}  {'created':25} {'expires':25} "
                     f"{'revoked':25} label\n")
    for t in rows:
        def when(d: datetime | None) -> str:
            return d.isoformat(timespec="seconds") if d else "-"

        sys.stdout.write(f"{t.id:>5}  {t.owner:16} {'yes' if t.is_admin else 'no':5}  "
                         f"{when(t.created_at):25} {when(t.expires_at):25} "
                         f"{when(t.revoked_at):25} {t.label or ''}\n")
    return 0


def _revoke(session: Session, args: argparse.Namespace) -> int:
    if (args.token_id is None) == (args.owner is None):
        sys.stderr.write("error: give a token id or --owner NAME (not both)\n")
        return 2
    if args.token_id is not None:
        row = repo.revoke_token(session=session, token_id=args.token_id)
        if row is None:
            sys.stderr.write(f"error: no token with id {args.token_id} "
                             "(see 'frenzy token list')\n")
            return 1
        sys.stderr.write(f"revoked token {row.id} of {row.owner}\n")
        return 0
    n = repo.revoke_tokens(session=session, owner=args.owner)
    sys.stderr.write(f"revoked {n} token(s) of {args.owner}\n")
    return 0
