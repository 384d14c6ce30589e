"""Prometheus and Alertmanager for the demo, when they are installed: configured as alerts/README.md says.

Prometheus finds the agent (``job="pitstop-agent"``) and every engine through it (``job="pitstop-engines"``)
with ``http_sd_configs`` on the control plane's ``/v1/prometheus/targets``, scrapes the control plane, and
evaluates the shipped rules (``alerts/pitstop-rules.yml``); Alertmanager receives what fires and keeps it on
its page (no receiver is configured: the demo pages nobody).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HOW_TO_GET = ("Prometheus and Alertmanager are not installed; on Debian or Ubuntu: "
              "sudo apt-get install prometheus prometheus-alertmanager (the demo runs on without them)")


@dataclass(frozen=True)
class Binaries:
    prometheus: str
    alertmanager: str | None


def find_binaries() -> Binaries | None:
    """Debian's ``prometheus`` and ``prometheus-alertmanager`` (or ``alertmanager``) on PATH; None without
    Prometheus."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        return None
    return Binaries(prometheus, shutil.which("prometheus-alertmanager") or shutil.which("alertmanager"))


def shipped_rules() -> Path | None:
    """The shipped rule file, or None in an install that left it out."""
    try:
        from pitstop.share import MissingShareError, folder
    except ImportError:
        return None
    try:
        rules = folder("alerts") / "pitstop-rules.yml"
    except MissingShareError:
        return None
    return rules if rules.is_file() else None


def prometheus_config(api_url: str, token_file: Path, alertmanager_url: str | None, rules: Path | None, *,
                      every_s: int = 5, scrape_timeout_s: int = 4) -> dict[str, Any]:
    """alerts/README.md's prometheus.yml for a control plane at ``api_url``, scraping and refreshing its
    targets every ``every_s`` seconds."""
    def discovered(job: str) -> dict[str, Any]:
        # The agent labels its own series with node (and gpu, replica, model): it is the authority for them,
        # so its job honours them rather than prefixing each with exported_ beside the target's node label.
        return {"job_name": job, "honor_labels": job == "pitstop-agent", "http_sd_configs": [{
            "url": f"{api_url}/v1/prometheus/targets?job={job}", "refresh_interval": f"{every_s}s",
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)}}]}

    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{every_s}s", "evaluation_interval": f"{every_s}s",
                   "scrape_timeout": f"{scrape_timeout_s}s"},
        "scrape_configs": [discovered("pitstop-agent"), discovered("pitstop-engines"),
                           {"job_name": "pitstop-controlplane",
                            "static_configs": [{"targets": [api_url.removeprefix("http://")]}]}],
    }
    if rules is not None:
        config["rule_files"] = [str(rules)]
    if alertmanager_url is not None:
        config["alerting"] = {"alertmanagers": [{"static_configs": [
            {"targets": [alertmanager_url.removeprefix("http://")]}]}]}
    return config


def alertmanager_config() -> dict[str, Any]:
    return {"route": {"receiver": "demo", "group_by": ["alertname", "node", "replica", "gpu", "model"],
                      "group_wait": "10s", "group_interval": "1m", "repeat_interval": "4h"},
            "receivers": [{"name": "demo"}]}


def argv(binaries: Binaries, home: Path, prometheus_port: int, alertmanager_port: int | None, api_url: str,
         token: str) -> dict[str, list[str]]:
    """Write the configs under ``home``; the command lines of Prometheus (and Alertmanager), by name."""
    home.mkdir(parents=True, exist_ok=True)
    token_file = home / "pitstop-token"
    token_file.write_text(token)
    token_file.chmod(0o600)
    out: dict[str, list[str]] = {}
    am_url = None
    if binaries.alertmanager is not None and alertmanager_port is not None:
        am_url = f"http://127.0.0.1:{alertmanager_port}"
        (home / "alertmanager.yml").write_text(yaml.safe_dump(alertmanager_config(), sort_keys=False))
        out["alertmanager"] = [binaries.alertmanager, f"--config.file={home / 'alertmanager.yml'}",
                               f"--storage.path={home / 'alertmanager-data'}",
                               f"--web.listen-address=127.0.0.1:{alertmanager_port}", "--cluster.listen-address="]
    (home / "prometheus.yml").write_text(yaml.safe_dump(
        prometheus_config(api_url, token_file, am_url, shipped_rules()), sort_keys=False))
    out["prometheus"] = [binaries.prometheus, f"--config.file={home / 'prometheus.yml'}",
                         f"--storage.tsdb.path={home / 'prometheus-data'}",
                         f"--web.listen-address=127.0.0.1:{prometheus_port}"]
    return out
