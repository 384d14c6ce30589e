"""API JSON → console rows: units, blanks for missing readings, stale marking."""

from __future__ import annotations

from typing import Any

from fastapi.testclient import TestClient

from controlplane.console import shaping
from tests.controlplane.fixtures import body, gpu, replica, report


def test_rows_from_real_api_output(client: TestClient) -> None:
    client.post("/v1/agents/gpu-a/report", json=body(report(
        replicas=[replica("r0", ttft=0.25, rss=2 * 1024**3, restarts=2)], gpus=[gpu(0, temperature=83.5)])))
    g = shaping.gpu_rows(client.get("/v1/gpus").json())[0]
    assert (g["temp °C"], g["slowdown °C"], g["headroom °C"]) == (83.5, 89.0, 5.5)
    assert (g["mem used GiB"], g["mem total GiB"], g["util %"], g["power W"]) == (70.0, 141.0, 80.0, 450.0)
    n = shaping.node_rows(client.get("/v1/nodes").json())[0]
    assert (n["node"], n["status"], n["last report"], n["replicas"]) == ("gpu-a", "up", "0s", 1)


def test_missing_readings_stay_blank() -> None:
    g = shaping.gpu_rows([{"node": "n", "index": 0, "temperature_celsius": None}])[0]
    assert g["headroom °C"] is None and g["throttle"] == "" and g["cordoned"] is False
    assert shaping.gpu_rows([{"node": "n", "index": 1, "cordoned": True}])[0]["cordoned"] is True


def test_ages() -> None:
    assert [shaping.age_text(s) for s in (4, 200, 7500, 270000, None)] == ["4s", "3m 20s", "2h 5m", "3d 3h", ""]


def test_launch_passes_settings_by_environment() -> None:
    from controlplane.console import launch

    args = launch._parser().parse_args(["--api-url", "http://cp:8000", "--port", "8600", "--token", "s3cret"])
    cmd = launch.command(args)
    assert cmd[1:4] == ["-m", "streamlit", "run"] and cmd[4].endswith("app.py")
    assert cmd[5:7] == ["--server.headless", "true"] and "8600" in cmd and "127.0.0.1" in cmd
    assert "s3cret" not in cmd  # the token never shows in the process list
    env = launch.environment(args, {"PATH": "/bin"})
    assert env["PITSTOP_CONSOLE_API_URL"] == "http://cp:8000" and env["PITSTOP_CONSOLE_TOKEN"] == "s3cret"
    assert env["PATH"] == "/bin"


def test_attention_lists_what_needs_a_person() -> None:
    nodes: list[dict[str, Any]] = [
        {"name": "gpu-a", "status": "up"},
        {"name": "gpu-b", "status": "stale", "last_report_age_seconds": 95},
    ]
    replicas: list[dict[str, Any]] = [
        {"node": "gpu-a", "name": "ok", "state": "READY", "engine": {"stalled": False}},
        {"node": "gpu-a", "name": "loop", "state": "BACKOFF", "restarts_total": 4},
        {"node": "gpu-a", "name": "wedged", "state": "READY", "engine": {"stalled": True}},
    ]
    gpus = [{"node": "gpu-a", "index": 0, "temperature_celsius": 85.0, "slowdown_temperature_celsius": 89.0},
            {"node": "gpu-a", "index": 1, "temperature_celsius": 70.0, "slowdown_temperature_celsius": 89.0},
            {"node": "gpu-a", "index": 2, "temperature_celsius": 88.0, "slowdown_temperature_celsius": None}]
    assert shaping.attention(nodes, replicas, gpus) == [
        "node gpu-b has not reported for 1m 35s",
        "replica gpu-a/loop is BACKOFF after 4 restarts",
        "replica gpu-a/wedged has queued work but generates no tokens (stalled engine)",
        "GPU gpu-a#0 at 85 °C, slowdown at 89 °C",
    ]
    assert shaping.attention(nodes[:1], replicas[:1], gpus[1:]) == []


def test_replica_detail(client: TestClient) -> None:
    client.post("/v1/agents/gpu-a/report", json=body(report()))
    detail = shaping.replica_detail(client.get("/v1/replicas/gpu-a/r0").json())
    assert detail["engine args"] == "--max-num-seqs 64" and detail["log tail"] == "INFO started"
    assert detail["canary"] == "" and detail["last exit code"] == "" and detail["since"] == "2026-11-29 11:55:00"
    assert shaping.replica_detail({"state": "READY", "canary_ok": False})["canary"] == "FAILED"
