"""On-call end to end with every real part: a wedged engine pages on-call and the restart that fixed it resolves.

A real ``pitstop server`` with its notifier sending to four receivers on loopback, one per format (Alertmanager's
webhook, PagerDuty, Slack, a signed webhook); a real ``pitstop agent`` supervising two simulated engines on
simulated GPUs, one of which wedges a few seconds after its first start (/health stays 200, no token moves)
while requests wait on it; a real Prometheus scraping the agent with the repository's rules (every ``for:`` cut
to seconds, as in tests/observability); and a real Alertmanager running a copy of the shipped
alerts/alertmanager.yml (its routes and inhibitions as shipped; receivers on loopback, secrets in files) that
posts to the control plane's POST /v1/alertmanager with an alertmanager-role token.

The stall policy (its ``for:`` cut to seconds) restarts the wedged replica, and its alert pages every receiver
saying so; Prometheus's EngineStalled reaches the control plane through Alertmanager, mapped to the replica;
the restarted engine is healthy at its new generation, and the resolve reaches every receiver. No secret shows
in the server's log or in GET /v1/alerts.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from jsonschema import Draft202012Validator

from bench.harness.http import probe
from controlplane.notify.signing import verify
from tests.helpers import SteadyTraffic, free_port, http_ok, wait_until
from tests.notify.receiving import Receiving, said
from tests.observability.conftest import StackProcesses
from tests.observability.stack import ALERTMANAGER, PROMETHEUS, query, shortened_rules, start_prometheus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None,
                       reason="needs Debian's prometheus and prometheus-alertmanager"),
]

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "alerts" / "alertmanager.yml"
SCHEMAS = Path(__file__).parent / "schemas"
WEDGE_ONCE = Path(__file__).parent / "wedge_once.py"

NODE = "oncall-node"
EXTERNAL = "https://pitstop.example.internal"
# Secrets, each distinct enough to be found in a log or an answer.
ROUTING_KEY = "R0UTINGKEYoncall0123456789abcdef"
HMAC_SECRET = "hmac-secret-oncall-7f3a9c"
SLACK_PATH = "services/T0ONCALL/B0ONCALL/slackpathsecret4d2e"
AM_TOKEN = "am-token-oncall-5b8d1e"
AGENT_TOKEN = "agent-token-oncall-2c7f4a"
VIEWER_TOKEN = "viewer-token-oncall-9e1b6d"
SECRETS = (ROUTING_KEY, HMAC_SECRET, SLACK_PATH, AM_TOKEN, AGENT_TOKEN, VIEWER_TOKEN)

# Pitstop's stall policy with its for: cut from 2m. Longer than the rules' 3 s, so Prometheus sees the wedge
# before the restart clears it.
STALL = {"name": "stall", "runbook_url": "runbooks/stall.md",
         "condition": {"detector": "stall", "for": "8s"}, "action": {"kind": "restart"},
         "notify": {"severity": "page"}, "guardrails": {"cooldown": "10m"}}
RECEIVERS = ("am", "pager", "chat", "signed")
SCHEMA_OF = {"am": "alertmanager_webhook_v4.json", "pager": "pagerduty_events_v2.json",
             "chat": "slack_incoming_webhook.json", "signed": "pitstop_webhook_v1.json"}


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _schema(name: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads((SCHEMAS / name).read_text()))


# -- the parts ----------------------------------------------------------------------------------------------------


def _start_server(tmp: Path, processes: StackProcesses, hooks: dict[str, Receiving]) -> str:
    policies = tmp / "policies"
    policies.mkdir()
    (policies / "stall.yaml").write_text(yaml.safe_dump(STALL))
    routing_key, hmac_secret = tmp / "pd-routing-key", tmp / "hook-hmac-secret"
    routing_key.write_text(ROUTING_KEY + "\n")
    hmac_secret.write_text(HMAC_SECRET + "\n")
    slack_url = hooks["chat"].url.removesuffix("/hook") + "/" + SLACK_PATH
    port = free_port()
    config = tmp / "server.yaml"
    config.write_text(yaml.safe_dump({
        "port": port, "database_url": f"sqlite:///{tmp / 'cp.db'}", "policy_defaults": False,
        "policy_dirs": [str(policies)], "policy_interval_seconds": 1, "executor_interval_seconds": 0.5,
        "notify_interval_seconds": 0.5, "action_deadline_seconds": 60,
        "agent_tokens": [AGENT_TOKEN], "viewer_tokens": [VIEWER_TOKEN], "alertmanager_tokens": [AM_TOKEN],
        "external_url": EXTERNAL, "runbook_base_url": "https://runbooks.example.internal/pitstop",
        "notifier": {
            "receivers": [
                {"name": "am", "alertmanager_webhook": {"url": hooks["am"].url}},
                {"name": "pager", "pagerduty": {"url": hooks["pager"].url, "routing_key_file": str(routing_key)}},
                {"name": "chat", "slack": {"webhook_url": slack_url}},
                {"name": "signed", "webhook": {"url": hooks["signed"].url, "hmac_secret_file": str(hmac_secret)}},
            ],
            "route": {"receiver": "am", "group_by": ["model", "node"], "group_wait": "0s",
                      "group_interval": "2s", "repeat_interval": "4h",
                      "routes": [{"receiver": name, "continue": True} for name in RECEIVERS]},
        },
    }))
    server = processes.start("server", "server", "--config", str(config))
    cp = f"http://127.0.0.1:{port}"
    processes.wait_serving(server, f"{cp}/healthz", 60)
    return cp


def _start_agent(tmp: Path, processes: StackProcesses, cp: str) -> tuple[str, int]:
    agent_port, wedged_port = free_port(), free_port()
    sim = ["--sim-startup-seconds", "1", "--sim-gpu-dir", str(tmp / "simgpu")]
    config = tmp / "agent.yaml"
    config.write_text(yaml.safe_dump({
        "node": NODE, "port": agent_port, "control_plane": cp, "token": AGENT_TOKEN, "report_interval": 1,
        "scrape_interval": 0.5, "canary_every": 2, "canary_timeout": 2, "gpu_backend": "sim", "sim_gpu_count": 2,
        "sim_gpu_dir": str(tmp / "simgpu"), "state_dir": str(tmp / "agent-state"),
        "replicas": [
            # Wedges 6 s after its first start (warm-up done by then); every restart comes back healthy.
            {"name": "wedged", "model": "tiny", "port": wedged_port, "gpus": [0], "args": sim,
             "command": [sys.executable, str(WEDGE_ONCE), str(tmp / "wedged-once"), "6",
                         "{model}", "--host", "{host}", "--port", "{port}"],
             "stop_timeout": 5, "drain_timeout": 2},
            {"name": "healthy", "model": "tiny", "port": free_port(), "gpus": [1], "args": sim,
             "stop_timeout": 5, "drain_timeout": 2},
        ],
    }))
    child = processes.start("agent", "agent", "--config", str(config))
    agent = f"http://127.0.0.1:{agent_port}"
    processes.wait_serving(child, f"{agent}/healthz", 60)
    return agent, wedged_port


def _alertmanager_config(tmp: Path, cp: str, sink: Receiving) -> Path:
    """The shipped config, its receivers on loopback and their secrets in files under ``tmp``; routes and
    inhibitions untouched."""
    shipped = yaml.safe_load(SHIPPED.read_text())
    config = yaml.safe_load(SHIPPED.read_text())
    secrets = tmp / "am-secrets"
    secrets.mkdir()

    def secret(name: str, value: str) -> str:
        (secrets / name).write_text(value + "\n")
        return str(secrets / name)

    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = f"{cp}/v1/alertmanager" if receiver["name"] == "pitstop" else sink.url
            auth = hook["http_config"]["authorization"]
            auth["credentials_file"] = secret(f"{receiver['name']}-token",
                                              AM_TOKEN if receiver["name"] == "pitstop" else "ticket-bridge-token")
        for pd in receiver.get("pagerduty_configs", []):
            pd["url"], pd["routing_key_file"] = sink.url, secret("pagerduty-routing-key", "am-routing-key")
        for chat in receiver.get("slack_configs", []):
            chat["api_url_file"] = secret("slack-webhook-url", sink.url)
    assert {r["name"] for r in config["receivers"]} == {"pitstop", "pager", "chat", "ticket"}
    assert (config["route"], config["inhibit_rules"]) == (shipped["route"], shipped["inhibit_rules"])
    path = tmp / "alertmanager.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def _start_alertmanager(tmp: Path, processes: StackProcesses, config: Path) -> str:
    assert ALERTMANAGER is not None
    port = free_port()
    child = processes.start_argv("alertmanager", [
        ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address=",
    ])
    url = f"http://127.0.0.1:{port}"
    processes.wait_serving(child, f"{url}/-/ready", 60)
    return url


# -- reading the parts --------------------------------------------------------------------------------------------


def _get(cp: str, path: str, **params: Any) -> Any:
    try:
        response = probe.get(f"{cp}{path}", params=params, headers=_bearer(VIEWER_TOKEN), timeout=5)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


def _alerts(cp: str) -> list[dict[str, Any]]:
    return _get(cp, "/v1/alerts") or []


def _restarts(cp: str) -> list[dict[str, Any]]:
    """The restarts the stall policy took (a repeat held by its cooldown is recorded as suppressed)."""
    return [a for a in _get(cp, "/v1/actions", policy="stall") or []
            if a["kind"] == "restart" and a["state"] != "suppressed"]


def _ready(agent: str, name: str) -> bool:
    return http_ok(f"{agent}/v1/replicas/{name}/ready", timeout=3)



def _first(hooks: dict[str, Receiving], name: str, status: str) -> tuple[int, dict[str, Any]] | None:
    for i, body in enumerate(list(hooks[name].bodies)):
        if said(name, body) == status:
            return i, body
    return None


def _everywhere(hooks: dict[str, Receiving], status: str) -> bool:
    return all(_first(hooks, name, status) is not None for name in RECEIVERS)


def _received(hooks: dict[str, Receiving], name: str, status: str) -> tuple[int, dict[str, Any]]:
    found = _first(hooks, name, status)
    assert found is not None, (name, status, hooks[name].bodies)
    return found


# -- the test -----------------------------------------------------------------------------------------------------


def test_a_wedge_pages_every_receiver_reaches_pitstop_through_alertmanager_and_resolves_after_the_restart(
        tmp_path: Path) -> None:
    processes = StackProcesses(tmp_path / "logs")
    hooks = {"am": Receiving(default=200), "pager": Receiving(default=202), "chat": Receiving(default=200),
             "signed": Receiving(default=200)}
    sink = Receiving(default=200)  # Alertmanager's own receivers other than the control plane
    try:
        cp = _start_server(tmp_path, processes, hooks)
        agent, wedged_port = _start_agent(tmp_path, processes, cp)
        am = _start_alertmanager(tmp_path, processes, _alertmanager_config(tmp_path, cp, sink))
        prom = start_prometheus(tmp_path, processes, agent=agent, alertmanager=am,
                                rules=shortened_rules(tmp_path / "rules.yml"))
        wait_until(lambda: _ready(agent, "wedged") and _ready(agent, "healthy"), 60, what="both replicas READY")
        wait_until(lambda: query(prom, 'up{job="pitstop-agent"} == 1')["data"]["result"] != [], 30,
                   what="Prometheus scraping the agent")
        first = _get(cp, f"/v1/replicas/{NODE}/wedged")
        assert first is not None, "the agent reports to the control plane"
        server_log = tmp_path / "logs" / "server.log"

        # The engine wedges 6 s after its first start; requests queue on it and no token moves.
        with SteadyTraffic(wedged_port, every=1.0, timeout=15):
            wait_until(lambda: _everywhere(hooks, "firing"), 120, interval=0.5,
                       what=f"the stall's page at every receiver (server log {server_log})")
            wait_until(lambda: _engine_stalled(cp) is not None, 90, interval=0.5,
                       what="Prometheus's EngineStalled posted by Alertmanager to the control plane")
            wait_until(lambda: _restarts(cp) != [] and _restarts(cp)[-1]["state"] in ("succeeded", "failed"), 90,
                       interval=0.5, what="the restart's outcome")
        _pages_say_what_pitstop_did(hooks)
        _alertmanager_input_is_mapped(cp)

        [restart] = _restarts(cp)
        assert restart["state"] == "succeeded", (restart, processes.log("server")[-3000:])
        assert restart["target"] == f"replica:{NODE}/wedged"
        replica = _get(cp, f"/v1/replicas/{NODE}/wedged")
        assert replica is not None and replica["state"] == "READY"
        assert replica["generation"] >= restart["params"]["applied"][f"{NODE}/wedged"] > first["generation"]

        # Back at the new generation and healthy: the stall clears for its for:, the alert resolves, and every
        # receiver is told.
        wait_until(lambda: _everywhere(hooks, "resolved"), 90, interval=0.5,
                   what=f"the resolve at every receiver (server log {server_log})")
        assert _ready(agent, "wedged") and _ready(agent, "healthy")
        _resolves_close_the_pages(hooks, cp)
        _no_secret_shows(cp, processes.log("server"))
    finally:
        processes.stop_all()
        for hook in [*hooks.values(), sink]:
            hook.close()


def _engine_stalled(cp: str) -> dict[str, Any] | None:
    return next((a for a in _alerts(cp) if a["policy"] == "alertmanager"
                 and a["labels"].get("alertname") == "EngineStalled" and a["labels"].get("replica") == "wedged"),
                None)


def _pages_say_what_pitstop_did(hooks: dict[str, Receiving]) -> None:
    """Each receiver's first page is its format's, for the wedged replica, and says Pitstop restarted it."""
    did = f"restart of {NODE}/wedged"
    _, am = _received(hooks, "am", "firing")
    _schema(SCHEMA_OF["am"]).validate(am)
    [alert] = am["alerts"]
    assert alert["labels"]["alertname"] == "pitstop-stall" and alert["labels"]["replica"] == "wedged"
    assert alert["labels"]["target"] == f"replica:{NODE}/wedged"
    assert did in alert["annotations"]["pitstop_action"], alert["annotations"]
    assert alert["annotations"]["runbook_url"] == "https://runbooks.example.internal/pitstop/runbooks/stall.md"
    assert alert["generatorURL"].startswith(f"{EXTERNAL}/?action=")

    _, pd = _received(hooks, "pager", "firing")
    _schema(SCHEMA_OF["pager"]).validate(pd)
    assert pd["event_action"] == "trigger" and pd["routing_key"] == ROUTING_KEY
    assert pd["payload"]["severity"] == "critical" and did in pd["payload"]["summary"], pd["payload"]["summary"]

    _, chat = _received(hooks, "chat", "firing")
    _schema(SCHEMA_OF["chat"]).validate(chat)
    assert did in chat["text"] and "pitstop-stall" in chat["blocks"][0]["text"]["text"]

    i, signed = _received(hooks, "signed", "firing")
    _schema(SCHEMA_OF["signed"]).validate(signed)
    [alert] = signed["alerts"]
    assert alert["labels"]["replica"] == "wedged" and did in alert["action_summary"]
    headers, raw = hooks["signed"].raw[i]
    verify(HMAC_SECRET.encode(), headers.get("X-Pitstop-Timestamp"), headers.get("X-Pitstop-Signature"), raw,
           datetime.fromtimestamp(int(headers["X-Pitstop-Timestamp"]), UTC))
    # Only the wedged replica pages: the healthy one raises nothing.
    for name in ("am", "signed"):
        assert {a["labels"]["replica"] for b in hooks[name].bodies for a in b["alerts"]} == {"wedged"}


def _alertmanager_input_is_mapped(cp: str) -> None:
    stalled = _engine_stalled(cp)
    assert stalled is not None
    assert stalled["labels"]["target"] == f"replica:{NODE}/wedged" and stalled["labels"]["node"] == NODE
    assert stalled["severity"] == "warning" and len(stalled["fingerprint"]) == 16
    assert stalled["annotations"]["runbook_url"] == f"{EXTERNAL}/runbooks/alerts/EngineStalled.md"
    # Alertmanager's alerts are Alertmanager's to page for: none reached Pitstop's receivers (checked above:
    # every body there is the stall policy's), and none is about the healthy replica.
    assert not any(a["labels"].get("replica") == "healthy" and a["labels"].get("alertname") == "EngineStalled"
                   for a in _alerts(cp))


def _resolves_close_the_pages(hooks: dict[str, Receiving], cp: str) -> None:
    # One page and one resolve per receiver: the page is not repeated while the alert fires.
    assert {name: [said(name, b) for b in hooks[name].bodies] for name in RECEIVERS} == {
        name: ["firing", "resolved"] for name in RECEIVERS}
    for name, schema in SCHEMA_OF.items():
        for body in hooks[name].bodies:
            _schema(schema).validate(body)

    def says_the_restart_succeeded(line: str) -> bool:
        # "restart of NODE/wedged succeeded at ...", or, when a policy round proposed the restart again as it
        # completed, that repeat held by the cooldown: "holding: cooldown: stall acted on replica:NODE/wedged
        # at ... (succeeded); ..." (controlplane/notify/summary.py describes the latest action).
        return f"{NODE}/wedged" in line and "succeeded" in line

    _, trigger = _received(hooks, "pager", "firing")
    _, resolve = _received(hooks, "pager", "resolved")
    assert resolve["event_action"] == "resolve" and resolve["dedup_key"] == trigger["dedup_key"]
    assert resolve["routing_key"] == ROUTING_KEY

    _, am = _received(hooks, "am", "resolved")
    [alert] = am["alerts"]
    assert alert["status"] == "resolved" and alert["labels"]["replica"] == "wedged"
    assert alert["endsAt"] != "0001-01-01T00:00:00Z"
    assert says_the_restart_succeeded(alert["annotations"]["pitstop_action"]), alert["annotations"]

    _, chat = _received(hooks, "chat", "resolved")
    assert "RESOLVED" in chat["blocks"][0]["text"]["text"] and says_the_restart_succeeded(chat["text"])

    i, signed = _received(hooks, "signed", "resolved")
    assert [a["status"] for a in signed["alerts"]] == ["resolved"]
    assert says_the_restart_succeeded(signed["alerts"][0]["action_summary"])
    headers, raw = hooks["signed"].raw[i]
    verify(HMAC_SECRET.encode(), headers.get("X-Pitstop-Timestamp"), headers.get("X-Pitstop-Signature"), raw,
           datetime.fromtimestamp(int(headers["X-Pitstop-Timestamp"]), UTC))

    [stall] = [a for a in _alerts(cp) if a["labels"].get("alertname") == "pitstop-stall"]
    assert stall["state"] == "resolved" and "clear for 8s" in stall["resolved_reason"], stall
    detail = _get(cp, f"/v1/alerts/{stall['id']}")
    assert detail is not None
    sent = sorted(d["receiver"] for d in detail["deliveries"] if d["status"] == "sent")
    assert sent == sorted(RECEIVERS * 2), detail["deliveries"]


def _no_secret_shows(cp: str, server_log: str) -> None:
    assert server_log, "the server wrote no log"
    listed = json.dumps(_alerts(cp))
    details = json.dumps([_get(cp, f"/v1/alerts/{a['id']}") for a in _alerts(cp)])
    for secret in SECRETS:
        assert secret not in server_log, f"a secret ({secret[:6]}...) is in the server's log"
        assert secret not in listed and secret not in details, f"a secret ({secret[:6]}...) is in GET /v1/alerts"
