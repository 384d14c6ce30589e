"""Real Prometheus and Alertmanager on loopback ports for tests, plus a webhook receiver that records alerts."""

from __future__ import annotations

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

from bench.harness.http import probe
from pitstop.demo_prometheus import prometheus_config
from tests.helpers import free_port, http_ok, wait_until
from tests.observability.conftest import StackProcesses
from tests.observability.rules import RULES

PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


class WebhookReceiver:
    """Alertmanager's webhook (version 4) payloads, as received, on a loopback port."""

    def __init__(self) -> None:
        self.payloads: list[dict[str, Any]] = []
        received = self.payloads
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with lock:
                    received.append(json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/alerts"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def alerts(self, status: str = "firing") -> list[dict[str, Any]]:
        return [a for p in list(self.payloads) for a in p.get("alerts", []) if a.get("status") == status]


def shortened_rules(dest: Path, for_seconds: int = 3, group_interval: str = "1s") -> Path:
    """A copy of the product rules with every ``for:`` cut to seconds, so a test sees alerts fire quickly.

    The product values (1m, 2m, 5m ...) are checked by the promtool unit tests in alerts/tests/.
    """
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        group["interval"] = group_interval
        for rule in group["rules"]:
            if "alert" in rule:
                rule["for"] = f"{for_seconds}s"
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def start_alertmanager(tmp: Path, processes: StackProcesses, webhook_url: str) -> str:
    assert ALERTMANAGER is not None
    port = free_port()
    config = tmp / "alertmanager.yml"
    config.write_text(yaml.safe_dump({
        "route": {"receiver": "pitstop", "group_by": ["alertname", "node", "replica", "gpu", "model"],
                  "group_wait": "1s", "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "pitstop", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }))
    return run_alertmanager(tmp, processes, config, port)


def run_alertmanager(tmp: Path, processes: StackProcesses, config: Path, port: int | None = None) -> str:
    """Alertmanager on a loopback port with ``config``, alone (no cluster), once it is ready."""
    assert ALERTMANAGER is not None
    port = port or free_port()
    processes.start_argv("alertmanager", [
        ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/-/ready"), 60, what="Alertmanager ready")
    return url


def start_prometheus(tmp: Path, processes: StackProcesses, *, agent: str, alertmanager: str, rules: Path) -> str:
    assert PROMETHEUS is not None
    port = free_port()
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.removeprefix("http://")]}]}]},
        "scrape_configs": [{"job_name": "pitstop-agent",
                            "static_configs": [{"targets": [agent.removeprefix("http://")]}]}],
    }))
    return _run_prometheus(tmp, processes, config, port)


def _run_prometheus(tmp: Path, processes: StackProcesses, config: Path, port: int) -> str:
    assert PROMETHEUS is not None
    processes.start_argv("prometheus", [
        PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/-/ready"), 60, what="Prometheus ready")
    return url


def query(prometheus: str, expr: str) -> dict[str, Any]:
    """The /api/v1/query answer; a PromQL error comes back as status "error" (HTTP 400), not an exception."""
    response = probe.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10)
    body: dict[str, Any] = response.json()
    return body


def firing(prometheus: str) -> list[dict[str, Any]]:
    data = probe.get(f"{prometheus}/api/v1/alerts", timeout=5).json()["data"]["alerts"]
    return [a for a in data if a["state"] == "firing"]


def start_prometheus_for_fleet(tmp: Path, processes: StackProcesses, *, control_plane: str, token: str,
                               rules: Path, alertmanager: str | None = None) -> str:
    """Prometheus configured as alerts/README.md says: agents and engines found through the control plane's
    http_sd endpoint (engines scraped through their agent), the control plane scraped directly."""
    assert PROMETHEUS is not None
    port = free_port()
    token_file = tmp / "prometheus-token"
    token_file.write_text(token)

    config = prometheus_config(control_plane, token_file, alertmanager, rules, every_s=1, scrape_timeout_s=1)
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    return _run_prometheus(tmp, processes, tmp / "prometheus.yml", port)
