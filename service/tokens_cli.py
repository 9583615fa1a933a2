"""``frenzy token create [--admin] --owner NAME``: make an API token and print it once.

``add_token_parser`` / ``run_token`` are wired into the ``frenzy`` console script by
``service.cli``. The token is written to stdout (the only place it ever appears); only its
SHA-256 is stored. The database is brought to the latest migration first, so this works on
a fresh install.
"""

from __future__ import annotations

import argparse
import logging
import sys

from service.auth import create_token
from service.db import repositories as repo
from service.db.engine import make_engine, make_session_factory, migrate, write_session
from service.settings import Settings, get_settings

log = logging.getLogger(__name__)


def add_token_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``token`` (with ``create`` and ``revoke``) to a ``frenzy`` subparsers object."""
    parser = subparsers.add_parser("token", help="manage API tokens")
    actions = parser.add_subparsers(dest="token_command", required=True)
    create = actions.add_parser("create", help="create a token and print it (shown once)")
    create.add_argument("--owner", required=True, help="user name the token acts as")
    create.add_argument("--admin", action="store_true", help="may use the admin endpoints")
    create.add_argument("--label", default=None, help="a note to recognise the token by")
    revoke = actions.add_parser("revoke", help="revoke every token of an owner")
    revoke.add_argument("--owner", required=True)
    for p in (create, revoke):
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
                try:
                    token = create_token(
                        session=session, owner=args.owner, is_admin=args.admin,
                        label=args.label,
                    )
                except ValueError as exc:
                    sys.stderr.write(f"error: {exc}\n")
                    return 2
                sys.stdout.write(token + "\n")
                return 0
            n = repo.revoke_tokens(session=session, owner=args.owner)
            sys.stderr.write(f"revoked {n} token(s) of {args.owner}\n")
            return 0
    finally:
        engine.dispose()
