"""``pitstop agent``: run the node agent (``--config FILE``; with no file: loopback, defaults, GPU-only)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

import httpx
import uvloop

from agent.config import AgentConfig, ConfigError, load_config
from agent.gpu import GpuBackendError, open_backend
from agent.lean_client import scrape_client
from agent.node import Agent
from agent.plain_http import PlainHttpTransport
from agent.tls import TlsConfigError, control_plane_ssl_context


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pitstop agent",
        description="Supervise vLLM replicas on this host, collect GPU/engine signals, serve them over HTTP "
                    "and report to the control plane. Settings: the config file, then PITSTOP_AGENT_* "
                    "environment variables.")
    parser.add_argument("--config", type=Path, default=None, help="YAML config file (default: none)")
    parser.add_argument("--check", action="store_true", help="validate the config, print it, and exit")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


async def serve(config: AgentConfig) -> int:
    """Run the agent until SIGINT, SIGTERM or SIGHUP; every managed engine is stopped before this returns."""
    try:
        gpu = open_backend(config.gpu_backend, config.sim_gpu_dir, config.sim_gpu_count,
                           config.recorded_gpu_file)
    except GpuBackendError as exc:
        print(f"pitstop agent: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # SIGHUP (the terminal closed) stops the agent as SIGTERM does, its engines drained and stopped first. No
    # reload: the settings are read once, at start.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, stop.set)
    try:
        tls = control_plane_ssl_context(config.control_plane_ca_file, config.control_plane_pin_sha256)
    except TlsConfigError as exc:
        print(f"pitstop agent: {exc}", file=sys.stderr)
        return 2
    async with httpx.AsyncClient() as client, scrape_client() as scraper, \
            httpx.AsyncClient(verify=tls, mounts={"http://": PlainHttpTransport()}) as reports:
        await Agent(config, client, gpu, scrape_client=scraper, report_client=reports).run(stop)
    return 0


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per probe and scrape drowns the log
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"pitstop agent: invalid config\n{exc}", file=sys.stderr)
        return 2
    if args.check:
        shown = config.model_copy(update={"token": "***" if config.token else None})  # never print the secret
        print(shown.model_dump_json(indent=2))
        return 0
    # uvloop's loop, with httptools under the server: a seventh less CPU than asyncio's and h11 at the defaults
    # (bench/README.md, the agent's cost).
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(config))
