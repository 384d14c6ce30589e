"""``pitstop server`` and ``pitstop console`` as real processes on loopback ports."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from bench.harness.http import probe
from tests.controlplane.fixtures import body, replica, report
from tests.helpers import free_port, http_ok, wait_until

ROOT = Path(__file__).resolve().parents[2]


class Running:
    """``pitstop ARGS`` in its own process group, logging to a file (a full pipe would block it)."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log_path = cwd / f"{args[0]}.log"
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", *args], cwd=cwd, env=env,
                                         stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> str:
        """SIGTERM the process group, SIGKILL it after a grace; return what it logged."""
        if self.alive():
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=5)
        return self.log_path.read_text(errors="replace")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    server = Running(["server", "--port", str(port)], cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: not server.alive() or http_ok(f"{url}/readyz"), timeout=30, what="pitstop server")
        assert server.alive(), server.stop()
        yield url
    finally:
        output = server.stop()
        # uvicorn re-raises SIGTERM after a clean shutdown, so the exit code says "signalled"; the log says clean.
        assert "Application shutdown complete" in output, output


@pytest.mark.slow
def test_server_process_accepts_a_report(server: str, tmp_path: Path) -> None:
    # A real server judges sent_at against its own clock: the report is sent now.
    r = report(replicas=[replica("chat-0")], sent_at=datetime.now(UTC))
    answer = probe.post(f"{server}/v1/agents/gpu-a/report", json=body(r), timeout=10)
    assert answer.status_code == 200 and answer.json()["node"] == "gpu-a"
    replicas = probe.get(f"{server}/v1/replicas", timeout=10).json()
    assert [x["name"] for x in replicas] == ["chat-0"]
    # With no flags the database lands in ./.pitstop/ of the working directory.
    assert (tmp_path / ".pitstop" / "pitstop.db").exists()
    assert "pitstop_cp_reports_received_total" in probe.get(f"{server}/metrics", timeout=10).text


@pytest.fixture
def console(server: str, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    console = Running(["console", "--api-url", server, "--port", str(port), "--refresh", "1"], cwd=tmp_path)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: not console.alive() or http_ok(f"{url}/_stcore/health"), timeout=60,
                   what="streamlit console")
        assert console.alive(), console.stop()
        yield url
    finally:
        console.stop()


@pytest.mark.slow
def test_console_in_a_real_browser_shows_replicas_as_they_arrive(server: str, console: str, tmp_path: Path) -> None:
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip("no chromium to drive")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1600})
            page.goto(console)
            # Signing in: the token goes into a password field, never into the URL.
            page.get_by_label("API token").fill("any-token")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_text("No replica has reported yet").wait_for(timeout=30_000)
            assert "any-token" not in page.url
            # The page refreshes by itself: a report posted now shows up without a reload.
            r = report(replicas=[replica("chat-0"), replica("chat-1")], sent_at=datetime.now(UTC))
            probe.post(f"{server}/v1/agents/gpu-a/report", json=body(r), timeout=10).raise_for_status()
            page.get_by_text("2 of 2 serving").wait_for(timeout=30_000)
            # Streamlit keeps the previous run's elements until the new run replaces them.
            page.get_by_text("No replica has reported yet").wait_for(state="detached", timeout=30_000)
            page.get_by_role("link", name="Nodes & GPUs").click()
            page.get_by_text("GPU 0 · NVIDIA H200").wait_for(timeout=30_000)
            page.screenshot(path=str(tmp_path / "console.png"), full_page=True)
        finally:
            browser.close()
