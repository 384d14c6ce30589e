"""The console in a real browser (Debian's chromium driven by Playwright) against a real control plane."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import yaml

from agent.wire import PROTOCOL_VERSION, EngineSample, GpuSample, NodeReport, ReplicaState, ReplicaStatus
from tests.helpers import free_port, http_ok, wait_until
from tests.integration.conftest import Processes

pytestmark = pytest.mark.slow

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
TOKEN = "e2e-agent-token"


def _report(node: str, replicas: list[str]) -> NodeReport:
    now = datetime.now(UTC)
    return NodeReport(
        protocol_version=PROTOCOL_VERSION,
        node=node,
        hostname="gpu-host-7",
        agent_version="0.1.0",
        sent_at=now,
        sequence=1,
        gpus=[
            GpuSample(
                index=0,
                uuid="GPU-e2e-0",
                name="NVIDIA H200",
                temperature_celsius=61.0,
                slowdown_temperature_celsius=89.0,
                memory_used_bytes=100 * 2**30,
                memory_total_bytes=141 * 2**30,
                utilization_ratio=0.75,
                power_watts=420.0,
                power_limit_watts=700.0,
            )
        ],
        replicas=[
            ReplicaStatus(
                name=name,
                model="meta-llama/Llama-3.1-8B-Instruct",
                url=f"http://127.0.0.1:{8100 + i}",
                state=ReplicaState.READY,
                ready=True,
                gpus=[0],
                state_since=now,
                engine=EngineSample(ttft_p99_seconds=0.123, itl_p99_seconds=0.021, requests_running=5,
                                    requests_waiting=1, kv_cache_usage_ratio=0.4),
            )
            for i, name in enumerate(replicas)
        ],
    )


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="Debian's chromium is not installed (make test installs it)")
def test_console_shows_the_fleet_in_a_real_browser(tmp_path: Path, processes: Processes) -> None:
    from playwright.sync_api import sync_playwright

    api_port, console_port = free_port(), free_port()
    cfg = tmp_path / "server.yaml"
    cfg.write_text(yaml.safe_dump({"port": api_port, "database_url": f"sqlite:///{tmp_path / 'cp.db'}",
                                   "agent_tokens": [TOKEN]}))
    processes.start("server", "server", "--config", str(cfg))
    api = f"http://127.0.0.1:{api_port}"
    wait_until(lambda: http_ok(f"{api}/healthz"), 60, what="the control plane")
    report = _report("gpu-node-a", ["llama-0", "llama-1"])
    r = httpx.post(f"{api}/v1/agents/gpu-node-a/report", content=report.model_dump_json(),
                   headers={"Authorization": f"Bearer {TOKEN}", "content-type": "application/json"}, timeout=10)
    assert r.status_code == 200, r.text

    processes.start("console", "console", "--api-url", api, "--port", str(console_port))
    console = f"http://127.0.0.1:{console_port}"
    wait_until(lambda: http_ok(f"{console}/_stcore/health"), 90, what="the console")

    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run"],
        )
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(console, wait_until="domcontentloaded")
            # Streamlit renders over a websocket: wait for the data, not for a fixed time.
            page.get_by_text("gpu-node-a").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            shot = tmp_path / "console.png"
            page.screenshot(path=str(shot), full_page=True)
            body = page.inner_text("body")
        finally:
            browser.close()
    assert "gpu-node-a" in body
    assert "READY" in body
    assert shot.stat().st_size > 10_000
    # Replica names live in a dataframe canvas, so read them through the page's accessible text or the API.
    assert "Traceback" not in body
