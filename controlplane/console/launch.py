"""``pitstop console``: start the Streamlit page, pointing it at a control plane by environment variables."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from controlplane.console.client import (
    DEFAULT_API_URL,
    ENV_API_URL,
    ENV_READ_ONLY,
    ENV_REFRESH,
    ENV_SERVICE_TOKEN,
    ENV_TOKEN,
    ENV_USER_HEADER,
)

APP = Path(__file__).with_name("app.py")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pitstop console",
                                     description="Open the Pitstop ops console (Streamlit) on loopback.")
    parser.add_argument("--api-url", default=os.environ.get(ENV_API_URL, DEFAULT_API_URL),
                        help=f"control-plane URL (default {DEFAULT_API_URL})")
    parser.add_argument("--port", type=int, default=8501, help="console port (default 8501)")
    parser.add_argument("--address", default="127.0.0.1", help="console listen address (default 127.0.0.1)")
    parser.add_argument("--token", default=None,
                        help=f"sign every session in with this token (one person's console; or set {ENV_TOKEN}); "
                             "without it each person signs in with their own")
    parser.add_argument("--read-only", action="store_true",
                        help=f"let anyone who reaches the console look without signing in, never act ({ENV_READ_ONLY}; "
                             f"reads with {ENV_SERVICE_TOKEN} if set)")
    parser.add_argument("--user-header", default=None,
                        help=f"behind a trusted proxy: the request header naming the person ({ENV_USER_HEADER}); "
                             f"they act as themselves through {ENV_SERVICE_TOKEN} when the control plane lets it act "
                             "on behalf of people (on_behalf_of), else they read with it and sign in to act")
    parser.add_argument("--refresh", type=float, default=5.0, help="seconds between refreshes (default 5)")
    return parser


def command(args: argparse.Namespace) -> list[str]:
    """The Streamlit command line for ``args``."""
    return [sys.executable, "-m", "streamlit", "run", str(APP),
            "--server.headless", "true", "--server.address", args.address, "--server.port", str(args.port),
            "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"]


def environment(args: argparse.Namespace, base: Mapping[str, str]) -> dict[str, str]:
    """``base`` plus the console's settings; the token goes by environment so it never shows in ``ps``."""
    env = dict(base)
    env[ENV_API_URL] = args.api_url
    env[ENV_REFRESH] = str(args.refresh)
    if args.token:
        env[ENV_TOKEN] = args.token
    if args.read_only:
        env[ENV_READ_ONLY] = "1"
    if args.user_header:
        env[ENV_USER_HEADER] = args.user_header
    return env


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    print(f"pitstop console: http://{args.address}:{args.port} (reading {args.api_url})", flush=True)
    argv_ = command(args)
    # Become Streamlit rather than wrap it: signals (Ctrl-C, SIGTERM from a supervisor) reach it directly
    # and no orphan is left behind if this process is killed.
    os.execve(argv_[0], argv_, environment(args, os.environ))
    return 0  # not reached: execve replaces this process
