"""deploy/: the systemd units verify, and the sample configs and env files load through the real config loaders.

The env files' examples count too: a commented ``# NAME=value`` line is what an operator uncomments, so every
assignment, commented or not, must give settings the loaders accept.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.config import load_config as load_agent_config
from controlplane.config import ConfiguredToken, ServerConfig
from controlplane.config import load_config as load_server_config
from controlplane.notify.secrets import resolve_secrets

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
CONFIG = DEPLOY / "config"
ASSIGNMENT = re.compile(r"^#?\s*([A-Z][A-Z0-9_]*)=(.*)$")
SYSTEM_UNITS = next((p for p in (Path("/usr/lib/systemd/system"), Path("/lib/systemd/system")) if p.is_dir()), None)


def unit(name: str) -> dict[str, list[str]]:
    """``Section.Key`` -> its values, in order (a key may repeat)."""
    found: dict[str, list[str]] = {}
    section = ""
    for line in (UNITS / name).read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found.setdefault(f"{section}.{key}", []).append(value)
    return found


def env_file(name: str, *, examples: bool) -> dict[str, str]:
    """The variables an env file sets; with ``examples``, its commented ones too."""
    found = {}
    for line in (CONFIG / name).read_text(encoding="utf-8").splitlines():
        match = ASSIGNMENT.match(line)
        if match and (examples or not line.startswith("#")):
            found[match.group(1)] = match.group(2)
    return found


def no_secret_files(path: str) -> str:
    raise AssertionError(f"the sample names a secret file ({path}); the samples keep secrets in the env file")


@pytest.mark.parametrize(("service", "component"), [("pitstop-agent.service", "agent"),
                                                    ("pitstop-server.service", "server")])
def test_each_unit_runs_the_installed_command_with_the_sample_files(service: str, component: str) -> None:
    u = unit(service)
    assert u["Service.ExecStart"] == [f"/opt/pitstop/bin/pitstop {component} --config /etc/pitstop/{component}.yaml"]
    assert u["Service.EnvironmentFile"] == [f"/etc/pitstop/{component}.env"]
    assert (CONFIG / f"{component}.yaml").is_file() and (CONFIG / f"{component}.env").is_file()
    assert u["Service.WorkingDirectory"] == [f"/var/lib/{u['Service.StateDirectory'][0]}"]
    assert u["Service.Restart"] == ["on-failure"]


def test_the_agent_unit_leaves_engines_to_the_next_agent_and_waits_out_a_drain() -> None:
    u = unit("pitstop-agent.service")
    # Anything but "process" has systemd kill the engines as soon as the agent's process exits, crash included,
    # and the restarted agent finds nothing to adopt.
    assert u["Service.KillMode"] == ["process"]
    config = load_agent_config(CONFIG / "agent.yaml", env={})
    stop_budget = float(u["Service.TimeoutStopSec"][0])
    for replica in config.replicas:
        assert replica.drain_grace + replica.drain_timeout + replica.stop_timeout < stop_budget, replica.name


def test_the_sample_agent_config_loads_with_its_env_file() -> None:
    env = env_file("agent.env", examples=True)
    config = load_agent_config(CONFIG / "agent.yaml", env=env)
    assert config.token == env["PITSTOP_AGENT_TOKEN"]
    assert config.gpu_backend == "nvml"
    assert str(config.resolved_state_dir) == unit("pitstop-agent.service")["Service.WorkingDirectory"][0]
    assert config.replicas and all(r.managed and r.engine == "vllm" for r in config.replicas)
    assert config.control_plane is not None and config.control_plane.startswith("https://")


def test_the_container_sample_runs_the_official_image_on_gpus_and_drains_within_the_units_stop() -> None:
    config = load_agent_config(CONFIG / "agent-containers.yaml", env=env_file("agent.env", examples=True))
    assert config.container_gpus == "nvidia" and config.docker_host == "unix:///var/run/docker.sock"
    assert config.replicas and all(r.runtime == "container" and r.engine == "vllm" for r in config.replicas)
    assert all((r.image or "").startswith("vllm/vllm-openai:v") for r in config.replicas)  # a pinned tag
    stop_budget = float(unit("pitstop-agent.service")["Service.TimeoutStopSec"][0])
    for replica in config.replicas:
        assert replica.gpus and replica.volumes, replica.name
        assert replica.drain_grace + replica.drain_timeout + replica.stop_timeout < stop_budget, replica.name


def test_the_sample_server_config_loads_and_its_env_file_holds_the_receivers_secrets() -> None:
    state = unit("pitstop-server.service")["Service.WorkingDirectory"][0]
    alone = load_server_config(CONFIG / "server.yaml", env={})
    assert alone.database_url == f"sqlite:///{state}/pitstop.db"
    assert alone.tls_cert_file is not None and alone.policy_defaults

    env = env_file("server.env", examples=True)
    config = load_server_config(CONFIG / "server.yaml", env=env)
    assert config.database_url == env["PITSTOP_SERVER_DATABASE_URL"]
    assert [t.get_secret_value() for t in config.admin_tokens] == [env["PITSTOP_SERVER_ADMIN_TOKENS"]]
    # What the server reads at start: every receiver's secret from the variables server.env sets, uncommented.
    resolved = resolve_secrets(config.notifier, env_file("server.env", examples=False), no_secret_files)
    assert sorted(resolved.receivers) == sorted(r.name for r in config.notifier.receivers)


def test_the_sample_server_configs_proxy_block_loads_once_uncommented() -> None:
    lines = (CONFIG / "server.yaml").read_text(encoding="utf-8").splitlines()
    # Settings are commented out as "#key:" and "#  nested"; prose reads "# text".
    block = "\n".join(line[1:] for line in lines if re.match(r"#(?:[^ #]|  )", line))
    assert "on_behalf_of: true" in block
    config = ServerConfig.model_validate(yaml.safe_load(block))
    [entry] = config.operator_tokens
    assert isinstance(entry, ConfiguredToken) and entry.on_behalf_of
    assert entry.token_env in env_file("server.env", examples=True)
    assert config.people.role_of("dana@example.internal") == "operator" and config.people.role_of("x") == "viewer"


def _verify_root(tmp_path: Path) -> Path:
    """A filesystem root with the system's units, ours installed, and the installed ``pitstop`` they run."""
    assert SYSTEM_UNITS is not None
    root = tmp_path / "root"
    shutil.copytree(SYSTEM_UNITS, root / SYSTEM_UNITS.relative_to("/"), symlinks=True)
    installed = root / "etc" / "systemd" / "system"
    installed.mkdir(parents=True)
    for service in sorted(UNITS.glob("*.service")):
        shutil.copy(service, installed / service.name)
        for command in unit(service.name)["Service.ExecStart"]:
            executable = root / command.split()[0].lstrip("/")
            executable.parent.mkdir(parents=True, exist_ok=True)
            executable.write_text("#!/bin/sh\nexit 0\n")
            executable.chmod(0o755)
    return root


def _verify(root: Path, *names: str) -> subprocess.CompletedProcess[str]:
    units = [str(root / "etc" / "systemd" / "system" / n) for n in names]
    return subprocess.run(["systemd-analyze", "verify", f"--root={root}", "--man=no", *units],
                          capture_output=True, text=True, timeout=60)


needs_systemd = pytest.mark.skipif(shutil.which("systemd-analyze") is None or SYSTEM_UNITS is None,
                                   reason="systemd-analyze and the system's unit directory are needed")


@needs_systemd
def test_systemd_verifies_the_units_unchanged(tmp_path: Path) -> None:
    root = _verify_root(tmp_path)
    done = _verify(root, "pitstop-agent.service", "pitstop-server.service")
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


@needs_systemd
def test_the_verification_sees_a_misspelt_setting_and_a_missing_command(tmp_path: Path) -> None:
    root = _verify_root(tmp_path)
    installed = root / "etc" / "systemd" / "system"
    text = (installed / "pitstop-agent.service").read_text(encoding="utf-8")
    (installed / "misspelt.service").write_text(text.replace("\nKillMode=", "\nKilMode="), encoding="utf-8")
    assert "Unknown key" in _verify(root, "misspelt.service").stderr
    (root / "opt" / "pitstop" / "bin" / "pitstop").unlink()
    done = _verify(root, "pitstop-agent.service")
    assert done.returncode != 0 and "/opt/pitstop/bin/pitstop" in done.stderr
