"""The whole stack as real processes on loopback, for the console's end-to-end test, its screenshots and its
benchmark: ``pitstop server`` (SQLite), ``pitstop agent`` supervising simulated engines (``pitstop sim serve``),
``pitstop console``, and Chromium driven by Playwright (Debian's, never a downloaded browser).

Every process runs in its own process group and is stopped with it, engines included. A person's operator token
is made with ``pitstop server token create``, so what they do in the console is recorded under their name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from bench.harness.http import probe
from pitstop.demo import Child
from tests.helpers import free_port, http_ok

ROOT = Path(__file__).resolve().parents[2]
PITSTOP = [sys.executable, "-m", "pitstop.cli"]
PERSON = "Dana Whitfield"
MODEL = "tiny-llama"
NODE = "gpu-node-1"
AGENT_TOKEN = "stack-agent-token"
# Streamlit re-runs a page on every refresh and on every click; a busy machine makes each run slow.
UI_TIMEOUT_MS = 90_000
# Simulated engines that start in half a second and warm up with two requests: a restart takes seconds.
SIM_ARGS = ["--sim-startup-seconds", "0.5", "--shutdown-timeout", "2", "--max-num-seqs", "64"]
FAST_REPLICA = {"drain_grace": 0.5, "drain_timeout": 5, "stop_timeout": 5, "start_timeout": 60,
                "warmup": {"requests": 2, "max_tokens": 4}}


def chromium_path() -> str | None:
    """Debian's Chromium, which Playwright drives through ``executable_path``."""
    return shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Stack:
    """The processes of one run, their URLs, and the person's token; ``stop`` ends every one of them."""

    work: Path
    children: list[Child] = field(default_factory=list)
    api_url: str = ""
    agent_url: str = ""
    console_url: str = ""
    person_token: str = ""
    database_url: str = ""

    # -- processes -----------------------------------------------------------------------------------------
    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        child = Child(name, argv, self.work / "logs" / f"{name}.log",
                      {"PYTHONPATH": str(ROOT), **(env or {})})
        child.start()
        self.children.append(child)
        return child

    def wait(self, check: Callable[[], bool], timeout: float, what: str, interval: float = 0.25) -> None:
        """Poll ``check`` until it holds; fail naming ``what`` (and any process that died) at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            dead = [c.name for c in self.children if not c.alive()]
            if dead:
                raise AssertionError(f"{', '.join(dead)} exited while waiting for {what}:\n{self.logs(dead)}")
            if check():
                return
            time.sleep(interval)
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}:\n{self.logs()}")

    def logs(self, names: list[str] | None = None, tail: int = 3000) -> str:
        out = []
        for child in self.children:
            if names is None or child.name in names:
                text = child.log.read_text(errors="replace") if child.log.exists() else ""
                out.append(f"--- {child.name}\n{text[-tail:]}")
        return "\n".join(out)

    def server(self, settings: dict[str, Any] | None = None, *, person: str = PERSON) -> str:
        """``pitstop server`` with a fresh database, and an operator token for ``person`` made by the CLI."""
        port = free_port()
        self.database_url = f"sqlite:///{self.work / 'pitstop.db'}"
        config = {"host": "127.0.0.1", "port": port, "database_url": self.database_url,
                  "agent_tokens": [AGENT_TOKEN], "policy_interval_seconds": 1.0, "executor_interval_seconds": 0.5,
                  "report_interval_seconds": 1.0, **(settings or {})}
        path = self.work / "server.yaml"
        self.work.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        made = subprocess.run([*PITSTOP, "server", "token", "create", "--config", str(path), "--role", "operator",
                               "--name", person], capture_output=True, text=True, check=True, cwd=self.work,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
        self.person_token = made.stdout.strip().splitlines()[-1]
        self._start("server", [*PITSTOP, "server", "--config", str(path), "--log-level", "warning"])
        self.api_url = f"http://127.0.0.1:{port}"
        self.wait(lambda: http_ok(f"{self.api_url}/readyz"), 90, "the control plane")
        return self.api_url

    def agent(self, replicas: int = 3, *, env: dict[str, dict[str, str]] | None = None, model: str = MODEL) -> str:
        """``pitstop agent`` on ``NODE`` supervising ``replicas`` simulated engines of ``model``, one GPU each;
        ``env``: per replica name, its engine's environment (the simulator's faults)."""
        port, sim_gpu_dir = free_port(), self.work / "simgpu"
        entries = [{"name": f"{model}-{i}", "model": model, "port": free_port(), "gpus": [i],
                    "args": ["--sim-gpu-dir", str(sim_gpu_dir), *SIM_ARGS],
                    "env": (env or {}).get(f"{model}-{i}", {}), **FAST_REPLICA} for i in range(replicas)]
        config = {"node": NODE, "port": port, "control_plane": self.api_url, "token": AGENT_TOKEN,
                  "report_interval": 1.0, "scrape_interval": 1.0, "process_interval": 2.0, "gpu_backend": "sim",
                  "sim_gpu_count": replicas, "sim_gpu_dir": str(sim_gpu_dir), "state_dir": str(self.work / "agent"),
                  "backoff": {"base": 0.5, "cap": 2}, "replicas": entries}
        path = self.work / "agent.yaml"
        path.write_text(yaml.safe_dump(config))
        self._start("agent", [*PITSTOP, "agent", "--config", str(path)])
        self.agent_url = f"http://127.0.0.1:{port}"
        self.wait(lambda: http_ok(f"{self.agent_url}/healthz"), 60, "the agent")
        return self.agent_url

    def console(self, *, refresh: float = 2.0, env: dict[str, str] | None = None,
                argv: list[str] | None = None) -> str:
        """``pitstop console`` on a free port (or ``argv`` with ``{port}`` filled, for another console)."""
        port = free_port()
        command = [*PITSTOP, "console", "--api-url", self.api_url, "--port", str(port), "--refresh", f"{refresh:g}"]
        if argv is not None:
            command = [part.format(port=port) for part in argv]
        # No token of the console's own: each person signs in with theirs.
        base = {"PITSTOP_CONSOLE_TOKEN": "", **(env or {})}
        self._start(f"console-{port}", command, base)
        url = f"http://127.0.0.1:{port}"
        self.wait(lambda: http_ok(f"{url}/_stcore/health"), 90, "the console")
        self.console_url = url
        return url

    def stop(self) -> None:
        while self.children:
            child = self.children.pop()
            child.stop(grace=30 if child.name == "agent" else 15)

    # -- the API, as the person ------------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.person_token}"}
        response = probe.get(f"{self.api_url}{path}", params=params, headers=headers, timeout=30)
        response.raise_for_status()
        return response.json()

    def ready_replicas(self) -> int:
        try:
            return sum(1 for r in self.get("/v1/replicas") if r.get("ready"))
        except (httpx.HTTPError, ValueError):
            return 0


@contextlib.contextmanager
def running(work: Path) -> Iterator[Stack]:
    stack = Stack(work)
    try:
        yield stack
    finally:
        stack.stop()


# -- the browser -----------------------------------------------------------------------------------------------
# Streamlit shows this widget while a script run is in progress, and marks elements of the run before as stale.
RUNNING = '[data-testid="stStatusWidget"]'
STALE = '[data-stale="true"]'


def settled(page: Any, timeout: float = UI_TIMEOUT_MS) -> None:
    """Wait until Streamlit has finished the run in progress: no running indicator, no stale element left."""
    page.wait_for_function(
        f"() => !document.querySelector('{RUNNING}') && !document.querySelector('{STALE}')", timeout=timeout)


def sign_in(page: Any, console_url: str, token: str) -> None:
    """Sign in through the form, as a person does: the token goes into the password field, never the URL."""
    page.goto(console_url)
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    page.get_by_text("Signed in as").wait_for(timeout=UI_TIMEOUT_MS)


def open_page(page: Any, title: str) -> None:
    """Follow the sidebar's link to the page ``title`` and wait until its content has rendered."""
    page.get_by_test_id("stSidebarNav").get_by_role("link", name=title).click()
    page.get_by_test_id("stHeading").filter(has_text=title).first.wait_for(timeout=UI_TIMEOUT_MS)
    page.get_by_text("last updated").wait_for(timeout=UI_TIMEOUT_MS)


_GRID_ROWS = """(column) => {
  for (const table of document.querySelectorAll('[data-testid="stDataFrame"] table[role="grid"]')) {
    const heads = {};
    for (const th of table.querySelectorAll('th[role="columnheader"]')) {
      heads[th.getAttribute('aria-colindex')] = th.textContent.trim();
    }
    if (!Object.values(heads).includes(column)) continue;
    const rows = [...table.querySelectorAll('tbody tr')].map(tr => Object.fromEntries(
      [...tr.querySelectorAll('td')].map(td => [heads[td.getAttribute('aria-colindex')], td.textContent.trim()])));
    if (rows.length) return rows;
  }
  return null;
}"""


def grid_rows(page: Any, column: str, timeout: float = UI_TIMEOUT_MS) -> list[dict[str, str]]:
    """The rows of the first table with a ``column`` header, as {header: cell text}.

    Streamlit draws a table's cells on a canvas; they are read from the accessible grid it keeps beside them,
    which holds the columns in view.
    """
    page.wait_for_function(f"(column) => ({_GRID_ROWS})(column) !== null", arg=column, timeout=timeout)
    rows: list[dict[str, str]] = page.evaluate(_GRID_ROWS, column)
    return rows
