"""``pitstop server``: run the control plane API, or ``pitstop server migrate`` to only migrate the database.

Settings come from defaults, then ``--config FILE``, then ``PITSTOP_SERVER_*`` variables, then these flags.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from controlplane import token_cli
from controlplane.config import ConfigError, ServerConfig, load_config


def _common(default: object) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", metavar="FILE", default=default, help="YAML settings file (optional)")
    common.add_argument("--database-url", metavar="URL", default=default,
                        help="sqlite:///path.db (default ./.pitstop/pitstop.db) or postgresql+psycopg://...")
    return common


def _parser() -> argparse.ArgumentParser:
    common = _common(None)
    serve = argparse.ArgumentParser(add_help=False)
    serve.add_argument("--host", help="listen address (default 127.0.0.1)")
    serve.add_argument("--port", type=int, help="listen port (default 8000)")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    parser = argparse.ArgumentParser(
        prog="pitstop server", parents=[common, serve],
        description="Run the Pitstop control plane: agents report here, the console reads here. "
                    "Migrations are applied on start. OpenAPI docs at /docs.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{migrate,token}")
    # SUPPRESS: flags given before "migrate" must survive the subcommand's own (absent) defaults.
    sub.add_parser("migrate", parents=[_common(argparse.SUPPRESS)], help="apply database migrations and exit",
                   description="Bring the database to the latest schema revision and exit.")
    token_cli.add_parser(sub, _common(argparse.SUPPRESS))
    return parser


def _settings(args: argparse.Namespace) -> ServerConfig:
    config = load_config(args.config)
    updates: dict[str, Any] = {}
    for flag in ("database_url", "host", "port"):
        value = getattr(args, flag, None)
        if value is not None:
            updates[flag] = value
    if not updates:
        return config
    try:
        return ServerConfig.model_validate({**config.model_dump(), **updates})
    except ValueError as exc:
        raise ConfigError(f"command line: {exc}") from exc


def _safe_url(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _migrate(config: ServerConfig) -> int:
    from controlplane.store.db import current_revision, make_engine, migrate

    engine = make_engine(config.database_url)
    try:
        migrate(engine)
        print(f"pitstop server: {_safe_url(config.database_url)} is at revision {current_revision(engine)}")
    finally:
        engine.dispose()
    return 0


def _serve(config: ServerConfig, log_level: str) -> int:
    import uvicorn

    from controlplane.api.app import create_app
    from controlplane.heap import HeapFreezer

    # Policy rounds in their own process by default: at fleet scale they would hold up reports here.
    app = create_app(config, heap=HeapFreezer(),
                     policy_process=config.policy_process, log_level=log_level)
    scheme = "https" if config.tls_cert_file else "http"
    print(f"pitstop server: listening on {scheme}://{config.host}:{config.port} "
          f"(database {_safe_url(config.database_url)}; docs at /docs)", flush=True)
    # SIGHUP (the terminal closed) stops the server as SIGTERM does: uvicorn's orderly shutdown, which stops the
    # policy process too. No reload: the settings are read once, at start. Left at its default, SIGHUP would
    # end this process at once, skipping the shutdown.
    signal.signal(signal.SIGHUP, lambda _sig, _frame: signal.raise_signal(signal.SIGTERM))
    uvicorn.run(app, host=config.host, port=config.port, log_level=log_level,
                ssl_certfile=config.tls_cert_file, ssl_keyfile=config.tls_key_file)
    return 0


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        config = _settings(args)
        if args.command == "migrate":
            return _migrate(config)
        if args.command == "token":
            return token_cli.run(args, config.database_url, sys.stdout)
        return _serve(config, args.log_level)
    except ConfigError as exc:
        print(f"pitstop server: configuration error:\n{exc}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"pitstop server: {exc}", file=sys.stderr)
        return 2
    except SQLAlchemyError as exc:
        print(f"pitstop server: database error: {exc.__class__.__name__}: {exc}", file=sys.stderr)
        return 1
