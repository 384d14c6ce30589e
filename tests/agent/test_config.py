"""Config loading: defaults without a file, env overrides, and errors that name file, line and field."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import ConfigError, load_config, parse_config
from pitstop.cli import main

Checker = Callable[[Path], tuple[int, str]]


def test_no_file_gives_loopback_defaults_and_no_replicas() -> None:
    config = load_config(None, env={})
    assert (config.host, config.port) == ("127.0.0.1", 9400)
    assert config.control_plane == "http://127.0.0.1:8000"
    assert config.report_interval == 5.0
    assert config.gpu_backend == "auto"
    assert config.replicas == []
    assert config.resolved_state_dir == Path(f"./.pitstop/agent-{config.node}")


def test_replica_defaults_and_argv_templates() -> None:
    config = parse_config("""
replicas:
  - name: a
    model: meta/llama
    port: 8001
    args: ["--max-num-seqs", "64"]
  - name: b
    model: qwen
    port: 8002
    engine: vllm
  - name: c
    model: tiny
    port: 8003
    command: ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "{model}", "--port", "{port}"]
  - name: attached
    url: http://10.0.0.5:8000
""", env={})
    a, b, c, attached = config.replicas
    assert a.argv() == [sys.executable, "-m", "pitstop.cli", "sim", "serve", "meta/llama", "--host", "127.0.0.1",
                        "--port", "8001", "--max-num-seqs", "64"]
    assert b.argv() == ["vllm", "serve", "qwen", "--host", "127.0.0.1", "--port", "8002"]
    assert c.argv(["--enforce-eager"]) == ["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "tiny",
                                           "--port", "8003", "--enforce-eager"]
    assert a.gpus == [0] and a.managed
    assert not attached.managed and attached.base_url == "http://10.0.0.5:8000"


def test_managed_engines_keep_the_agents_connection_past_two_scrape_intervals() -> None:
    # vLLM's API server ends a connection idle VLLM_HTTP_TIMEOUT_KEEP_ALIVE seconds (5 unless set): shorter than
    # the agent's gap between two reads of an engine, every scrape would open a new connection.
    text = """
scrape_interval: {interval}
replicas:
  - {{name: a, model: m, port: 8001}}
  - {{name: b, model: m, port: 8002, engine: vllm}}
  - {{name: c, model: m, port: 8003, engine: vllm, env: {{VLLM_HTTP_TIMEOUT_KEEP_ALIVE: "60"}}}}
"""
    config = parse_config(text.format(interval=5), env={})
    a, b, c = config.replicas
    assert config.engine_env(a, {}) == {"PITSTOP_SIM_GPU_DIR": str(config.sim_gpu_dir),
                                        "VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "15"}
    assert config.engine_env(b, {}) == {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "15"}
    # What the operator set stays: in the replica's env, or in the agent's own environment.
    assert config.engine_env(c, {}) == {}
    assert config.engine_env(b, {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "3"}) == {}
    fast = parse_config(text.format(interval=0.5), env={})
    assert fast.engine_env(fast.replicas[1], {}) == {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "6"}
    slow = parse_config(text.format(interval=30), env={})
    assert slow.engine_env(slow.replicas[1], {}) == {"VLLM_HTTP_TIMEOUT_KEEP_ALIVE": "65"}


def test_environment_overrides_main_settings() -> None:
    config = parse_config("port: 9500\n", env={"PITSTOP_AGENT_PORT": "9600", "PITSTOP_AGENT_CONTROL_PLANE": "null",
                                               "PITSTOP_AGENT_TOKEN": "s3cret", "PITSTOP_AGENT_NODE": "gpu-7"})
    assert (config.port, config.control_plane, config.token, config.node) == (9600, None, "s3cret", "gpu-7")


def test_error_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: n1\nreplicas:\n  - name: ok\n    model: m\n    port: 8001\n"
                    "  - name: bad\n    model: m\n    port: not-a-port\n")
    with pytest.raises(ConfigError) as err:
        load_config(path, env={})
    message = str(err.value)
    assert f"{path}:8" in message
    assert "replicas.1.port" in message


def test_unknown_field_and_missing_port_are_reported() -> None:
    with pytest.raises(ConfigError, match="report_intervall"):
        parse_config("report_intervall: 3\n", "a.yaml", env={})
    with pytest.raises(ConfigError, match="needs 'port'"):
        parse_config("replicas:\n  - name: r\n    model: m\n", "a.yaml", env={})
    with pytest.raises(ConfigError, match="unique"):
        parse_config("replicas:\n  - {name: r, model: m, port: 1}\n  - {name: r, model: m, port: 2}\n", env={})


def test_broken_yaml_names_the_line() -> None:
    with pytest.raises(ConfigError, match=r"a\.yaml:2"):
        parse_config("node: x\nport: 9400: 9500\n", "a.yaml", env={})


@pytest.fixture
def check(monkeypatch: pytest.MonkeyPatch,
          capsys: pytest.CaptureFixture[str]) -> Callable[[Path], tuple[int, str]]:
    """``pitstop agent --config PATH --check``: its exit code and what it printed to stderr."""
    for key in [k for k in os.environ if k.startswith("PITSTOP_AGENT_")]:
        monkeypatch.delenv(key)

    def run(path: Path) -> tuple[int, str]:
        code = main(["agent", "--config", str(path), "--check"])
        return code, capsys.readouterr().err
    return run


REPLICAS = "node: n1\nreplicas:\n  - name: a\n    model: m\n    port: 8001\n  - name: b\n    model: m\n"


@pytest.mark.parametrize("second", ["    port: 8001\n", "    host: 0.0.0.0\n    port: 8001\n"])
def test_check_refuses_two_replicas_on_one_port(tmp_path: Path, check: Checker, second: str) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(REPLICAS + second)
    code, err = check(path)
    assert code == 2
    line = len((REPLICAS + second).splitlines())
    assert f"{path}:{line}: replicas.1.port: replicas 'a' and 'b' would" in err
    assert "the second engine could not bind it, and its probes would reach the first" in err
    assert f"(replicas.0.port: {path}:5)" in err


def test_check_refuses_a_replica_on_the_agents_port(tmp_path: Path, check: Checker) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("node: n1\nport: 9500\nreplicas:\n  - name: a\n    model: m\n    port: 9500\n")
    code, err = check(path)
    assert code == 2
    assert (f"{path}:6: replicas.0.port: replica 'a' would listen on 127.0.0.1:9500, the agent's own port: the "
            f"engine could not bind it (port: {path}:2)") in err
    path.write_text("node: n1\nreplicas:\n  - name: a\n    model: m\n    port: 9400\n")  # the default port
    code, err = check(path)
    assert code == 2 and "the agent's own port" in err and "(port: its default or the environment)" in err


def test_check_refuses_a_replica_name_used_twice(tmp_path: Path, check: Checker) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(REPLICAS.replace("name: b", "name: a") + "    port: 8002\n")
    code, err = check(path)
    assert code == 2
    assert (f"{path}:6: replicas.1.name: replica names must be unique: replicas 0 and 1 are both named 'a' "
            f"(replicas.0.name: {path}:3)") in err


def test_check_accepts_distinct_addresses_and_attached_engines(tmp_path: Path, check: Checker) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text(REPLICAS + "    host: 10.0.0.7\n    port: 8001\n"  # another interface: its own port 8001
                    "  - name: c\n    url: http://127.0.0.1:8001\n"  # attached: not ours to bind
                    "  - name: d\n    model: m\n    port: 8003\n")
    code, err = check(path)
    assert code == 0, err


def test_a_gpu_index_no_gpu_can_have_is_refused_at_load(tmp_path: Path) -> None:
    path = tmp_path / "agent.yaml"
    path.write_text("replicas:\n  - name: a\n    model: m\n    port: 8001\n    gpus: [0, 2000]\n")
    with pytest.raises(ConfigError, match=r"replicas\.0\.gpus\.1"):
        load_config(path)
