"""``pitstop server token create|list|revoke|rotate``: manage API tokens in the database directly.

``create`` and ``rotate`` print the token once, on its own line, and nothing else that is secret; the
database keeps only a salted hash. Every change is written to the audit log as actor ``cli``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TextIO

from controlplane import audit
from controlplane.security import tokens
from controlplane.security.roles import Principal, Role
from controlplane.store.db import make_engine, make_sessionmaker, migrate, session_scope

CLI_ACTOR = Principal(name="cli", role=Role.ADMIN)


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser) -> None:
    token = sub.add_parser("token", parents=[common], help="create, list, revoke or rotate API tokens",
                           description="Manage API tokens. A token is printed once, when it is created.")
    ops = token.add_subparsers(dest="token_command", required=True, metavar="{create,list,revoke,rotate}")
    create = ops.add_parser("create", parents=[common], help="create a token and print it once")
    create.add_argument("--role", required=True, choices=[r.value for r in Role])
    create.add_argument("--name", help="who or what uses it (default: the role)")
    create.add_argument("--node", help="agent tokens: the only node it may report as")
    create.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h (default: never)")
    ops.add_parser("list", parents=[common], help="list tokens (never their secrets)")
    revoke = ops.add_parser("revoke", parents=[common], help="revoke a token now")
    revoke.add_argument("id", type=int)
    rotate = ops.add_parser("rotate", parents=[common], help="replace a token and print the new one once")
    rotate.add_argument("id", type=int)
    rotate.add_argument("--overlap", metavar="DURATION", default="0",
                        help="keep the old token working this long (default: revoke it now)")


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def run(args: argparse.Namespace, database_url: str, out: TextIO,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> int:
    engine = make_engine(database_url)
    try:
        migrate(engine)
        sessions = make_sessionmaker(engine)
        now = clock()
        with session_scope(sessions) as session:
            if args.token_command == "create":
                role = Role(args.role)
                if args.node and role is not Role.AGENT:
                    raise ValueError("--node is only for --role agent")
                expires = None if args.expires_in is None else now + tokens.parse_duration(args.expires_in)
                made = tokens.create_token(session=session, name=args.name or role.value, role=role,
                                           node=args.node, now=now, expires_at=expires)
                audit.record(session=session, who=CLI_ACTOR, what="token.create", target=f"token:{made.id}",
                             now=now, detail={"name": made.name, "role": role.value})
                print(f"created token {made.id} ({made.name}, {role.value}); it is shown only now:", file=out)
                print(made.token, file=out)
            elif args.token_command == "list":
                print(f"{'ID':>4}  {'NAME':20} {'ROLE':12} {'NODE':16} {'CREATED':20} {'EXPIRES':20} "
                      f"{'REVOKED':20} LAST USED", file=out)
                for t in tokens.list_tokens(session=session):
                    print(f"{t.id:>4}  {t.name[:20]:20} {t.role.value:12} {(t.node or '-')[:16]:16} "
                          f"{_when(t.created_at):20} {_when(t.expires_at):20} {_when(t.revoked_at):20} "
                          f"{_when(t.last_used_at)}", file=out)
            elif args.token_command == "revoke":
                if tokens.revoke_token(session=session, token_id=args.id, now=now) is None:
                    print(f"no token {args.id}", file=out)
                    return 1
                audit.record(session=session, who=CLI_ACTOR, what="token.revoke", target=f"token:{args.id}", now=now)
                print(f"revoked token {args.id}", file=out)
            else:
                overlap: timedelta = tokens.parse_duration(args.overlap)
                new = tokens.rotate_token(session=session, token_id=args.id, now=now, overlap=overlap)
                if new is None:
                    print(f"no usable token {args.id}", file=out)
                    return 1
                audit.record(session=session, who=CLI_ACTOR, what="token.rotate", target=f"token:{args.id}",
                             now=now, detail={"replacement": new.id})
                print(f"token {new.id} replaces {args.id}; it is shown only now:", file=out)
                print(new.token, file=out)
        return 0
    finally:
        engine.dispose()
