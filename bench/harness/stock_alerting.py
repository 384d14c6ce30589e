"""The stock alerting pipeline: real Prometheus evaluating the repo's rules, real Alertmanager, a webhook.

This is the baseline the remediation benchmarks compare against, and what the observability tests run:
Prometheus scrapes the agent's /metrics, evaluates ``alerts/pitstop-rules.yml`` and sends firing alerts to
Alertmanager, which groups them (``group_wait``) and posts them (webhook version 4) to a receiver that
stamps each alert with its arrival time.
"""

from __future__ import annotations

import json
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import yaml

from bench.harness.procs import Processes, free_port, http_ok, wait_until
from bench.harness.receiver import Answer, LoopbackReceiver

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "pitstop-rules.yml"
PROMETHEUS = shutil.which("prometheus")
ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


@dataclass(frozen=True)
class Delivery:
    """One alert as Alertmanager delivered it, with the receiver's wall-clock arrival time."""

    at: float
    status: str
    labels: dict[str, str]
    annotations: dict[str, str]


class WebhookReceiver(LoopbackReceiver):
    """Alertmanager webhook (version 4) posts on a loopback port, each alert kept with its arrival time."""

    def __init__(self) -> None:
        self.deliveries: list[Delivery] = []
        super().__init__("/alerts", self._receive)

    def _receive(self, at: float, raw: bytes) -> Answer:
        body = json.loads(raw)
        self.deliveries.extend(Delivery(at, a.get("status", ""), a.get("labels", {}), a.get("annotations", {}))
                               for a in body.get("alerts", []))
        return 200, {}, b""

    def first(self, alertname: str, **labels: str) -> Delivery | None:
        """The earliest firing delivery of ``alertname`` whose labels include ``labels``."""
        for d in list(self.deliveries):
            if d.status == "firing" and d.labels.get("alertname") == alertname and all(
                    d.labels.get(k) == v for k, v in labels.items()):
                return d
        return None


def duration_seconds(text: str) -> float:
    """A Prometheus duration as the rules write it (``2m``, ``30s``, ``1h30m``, ``0s``) in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)", str(text))
    if not parts or "".join(n + u for n, u in parts) != str(text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * units[u] for n, u in parts)


def rules_copy(dest: Path, *, for_seconds: int | None = None, interval: str | None = None,
               max_for_seconds: int | None = None) -> Path:
    """The product rules, unchanged by default; ``for_seconds``/``interval`` shorten them (labelled so).

    ``max_for_seconds`` caps every alert's ``for:`` (a longer one is cut to it, a shorter one is kept): a
    tuned pipeline rather than a uniformly shortened one."""
    data = yaml.safe_load(RULES.read_text())
    for group in data["groups"]:
        if interval is not None:
            group["interval"] = interval
        for rule in group["rules"]:
            if "alert" in rule and for_seconds is not None:
                rule["for"] = f"{for_seconds}s"
            if "alert" in rule and max_for_seconds is not None and \
                    duration_seconds(rule.get("for", "0s")) > max_for_seconds:
                rule["for"] = f"{max_for_seconds}s"
    dest.write_text(yaml.safe_dump(data, sort_keys=False))
    return dest


def rule_for(alertname: str) -> str:
    """The ``for:`` of one alert in the product rules (as written there)."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alertname:
                return str(rule.get("for", "0s"))
    raise KeyError(alertname)


def start_alertmanager(tmp: Path, processes: Processes, webhook_url: str, *, group_wait: str = "30s",
                       group_interval: str = "5m", name: str = "alertmanager") -> str:
    """Alertmanager posting to ``webhook_url``; config and storage under ``tmp``, its log as ``name``."""
    if ALERTMANAGER is None:
        raise RuntimeError("needs Debian's prometheus-alertmanager")
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "alertmanager.yml"
    config.write_text(yaml.safe_dump({
        "route": {"receiver": "pitstop", "group_by": ["alertname", "node", "replica", "gpu", "model"],
                  "group_wait": group_wait, "group_interval": group_interval, "repeat_interval": "4h"},
        "receivers": [{"name": "pitstop", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }))
    processes.start_argv(name, [
        ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/-/ready"), 60, what="Alertmanager ready")
    return url


def start_prometheus(tmp: Path, processes: Processes, *, targets: list[str], alertmanager: str, rules: Path,
                     scrape_interval: str = "15s", evaluation_interval: str = "15s",
                     name: str = "prometheus", control_plane: str | None = None) -> str:
    """Prometheus scraping the agents ``targets`` with ``rules``; config and storage under ``tmp``, its log as
    ``name``. With ``control_plane``, also every engine through its agent, found by the control plane's service
    discovery, as alerts/README.md configures it: the SLO rules read vLLM's own histograms."""
    if PROMETHEUS is None:
        raise RuntimeError("needs Debian's prometheus")
    port = free_port()
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump({
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                   "scrape_timeout": "5s" if scrape_interval != "1s" else "1s"},
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager.removeprefix("http://")]}]}]},
        "scrape_configs": [{"job_name": "pitstop-agent", "honor_labels": True,
                            "static_configs": [{"targets": [t.removeprefix("http://") for t in targets]}]}] + (
            [{"job_name": "pitstop-engines", "http_sd_configs": [
                {"url": f"{control_plane}/v1/prometheus/targets?job=pitstop-engines", "refresh_interval": "5s"}]}]
            if control_plane else []),
    }))
    processes.start_argv(name, [
        PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'prom-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ])
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: http_ok(f"{url}/-/ready"), 60, what="Prometheus ready")
    return url
