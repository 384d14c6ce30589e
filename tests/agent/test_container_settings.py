"""The container runtime's settings (``agent.container_settings``), what the create call carries
(``agent.containers.container_body``) and the log frames the daemon sends (``agent.docker_api.demux_logs``)."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from agent.config import ConfigError, parse_config
from agent.container_settings import size_bytes
from agent.containers import container_body, describe_exit
from agent.docker_api import demux_logs
from pitstop.cli import main

VALID = """\
node: gpu-7
docker_host: unix:///run/podman/podman.sock
container_gpus: cdi
replicas:
  - name: r0
    model: Qwen/Qwen3-8B
    port: 8001
    engine: vllm
    gpus: [0, 1]
    runtime: container
    image: vllm/vllm-openai:v0.11.0
    pull: never
    volumes: ["/models:/root/.cache/huggingface:ro"]
    shm_size: 16g
    env: {HF_HUB_OFFLINE: "1"}
"""


def test_a_container_replica_is_understood_and_runs_the_engines_command_in_the_image() -> None:
    config = parse_config(VALID, env={})
    spec = config.replicas[0]
    assert (config.docker_host, config.container_gpus) == ("unix:///run/podman/podman.sock", "cdi")
    argv = spec.argv()
    assert argv[:3] == ["vllm", "serve", "Qwen/Qwen3-8B"] and argv[3:7] == ["--host", "127.0.0.1", "--port", "8001"]
    body = container_body(spec, argv, {"HF_HUB_OFFLINE": "1"}, {"io.pitstop.node": "gpu-7"}, "cdi")
    host = body["HostConfig"]
    assert body["Image"] == "vllm/vllm-openai:v0.11.0"
    assert (body["Entrypoint"], body["Cmd"]) == (["vllm"], argv[1:])  # the image's entrypoint is not used
    assert body["Env"] == ["HF_HUB_OFFLINE=1"] and body["Labels"] == {"io.pitstop.node": "gpu-7"}
    assert host["NetworkMode"] == "host" and host["ShmSize"] == 16 * 2**30
    assert host["Binds"] == ["/models:/root/.cache/huggingface:ro"]
    assert host["RestartPolicy"] == {"Name": "no"}  # Pitstop restarts engines, not the daemon
    assert [d["PathOnHost"] for d in host["Devices"]] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    nvidia = container_body(spec, argv, {}, {}, "nvidia")["HostConfig"]
    assert nvidia["DeviceRequests"] == [{"Driver": "nvidia", "DeviceIDs": ["0", "1"], "Capabilities": [["gpu"]]}]
    assert "DeviceRequests" not in container_body(spec, argv, {}, {}, "none")["HostConfig"]


def test_a_published_port_listens_inside_and_is_published_on_the_replicas_host_only() -> None:
    spec = parse_config(VALID.replace("    pull: never\n", "    network: published\n"), env={}).replicas[0]
    argv = spec.argv()
    assert argv[3:5] == ["--host", "0.0.0.0"]
    body = container_body(spec, argv, {}, {}, "none")
    assert body["ExposedPorts"] == {"8001/tcp": {}}
    assert body["HostConfig"]["PortBindings"] == {"8001/tcp": [{"HostIp": "127.0.0.1", "HostPort": "8001"}]}
    assert "NetworkMode" not in body["HostConfig"]


@pytest.mark.parametrize(("change", "field", "words"), [
    (("    image: vllm/vllm-openai:v0.11.0\n", ""), "replicas.0.image", "'runtime: container' needs 'image'"),
    (("/models:/root/.cache/huggingface:ro", "models-here"), "replicas.0.volumes.0",
     "a volume is HOST:CONTAINER"),
    (("/models:/root/.cache/huggingface:ro", "/models:cache:ro"), "replicas.0.volumes.0", "must be absolute"),
    (("/models:/root/.cache/huggingface:ro", "/models:/cache:rx"), "replicas.0.volumes.0",
     "unknown volume option 'rx'"),
    (("shm_size: 16g", "shm_size: lots"), "replicas.0.shm_size", "a size is a byte count"),
    (("shm_size: 16g", "shm_size: 16g\n    ipc: host"), "replicas.0.shm_size", "cannot be set with 'ipc: host'"),
    (("pull: never", "pull: sometimes"), "replicas.0.pull", "'never', 'missing' or 'always'"),
    (("runtime: container", "runtime: process"), "replicas.0.image", "is a setting of the container runtime"),
    (("container_gpus: cdi", "container_gpus: amd"), "container_gpus", "'nvidia', 'cdi' or 'none'"),
    (("unix:///run/podman/podman.sock", "/run/podman/podman.sock"), "docker_host", "should match pattern"),
    (("    pull: never\n", "    pull: never\n    live_limits: true\n"), "replicas.0.live_limits",
     "not yet available with 'runtime: container'"),
])
def test_check_names_the_file_line_and_field_of_a_bad_container_setting(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        change: tuple[str, str], field: str, words: str) -> None:
    for key in [k for k in os.environ if k.startswith("PITSTOP_AGENT_")]:
        monkeypatch.delenv(key)
    text = VALID.replace(*change)
    assert text != VALID
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    assert main(["agent", "--config", str(path), "--check"]) == 2
    err = capsys.readouterr().err
    assert f"{field}: " in err and words in err, err
    # The field's own line; a field the file lacks is named at its replica's.
    key = next(p for p in reversed(field.split(".")) if not p.isdigit())
    rows = text.splitlines()
    line = next((i for i, row in enumerate(rows, 1) if row.strip().startswith(f"{key}:")),
                next(i for i, row in enumerate(rows, 1) if row.strip().startswith("- name:")))
    assert f"{path}:{line}: {field}" in err, err


def test_an_attached_replica_cannot_be_a_container() -> None:
    with pytest.raises(ConfigError, match="an attached replica"):
        parse_config("replicas:\n  - {name: a, url: 'http://10.0.0.1:8000', runtime: container, image: x}\n",
                     env={})


def test_sizes_read_as_docker_writes_them() -> None:
    assert [size_bytes(v) for v in (1024, "512m", "16g", "1.5g", "64k", "100")] == [
        1024, 512 * 2**20, 16 * 2**30, int(1.5 * 2**30), 64 * 1024, 100]
    for bad in (0, "0", "-1g", "16 gigs", ""):
        with pytest.raises(ValueError):
            size_bytes(bad)


def _frame(stream: int, text: bytes) -> bytes:
    return struct.pack(">BxxxI", stream, len(text)) + text


def test_log_frames_are_joined_in_order_and_a_plain_body_is_plain_text() -> None:
    raw = _frame(1, b"INFO starting\nINFO loading ") + _frame(2, b"weights\nERROR CUDA out of memory\n")
    assert demux_logs(raw) == ["INFO starting", "INFO loading weights", "ERROR CUDA out of memory"]
    assert demux_logs(b"a terminal's\nplain output\n") == ["a terminal's", "plain output"]
    assert demux_logs(b"") == []


def test_an_exit_is_told_as_a_person_reads_it() -> None:
    assert describe_exit({"ExitCode": 137, "OOMKilled": True}) == "container exited with code 137, OOMKilled"
    assert describe_exit({"ExitCode": 1, "OOMKilled": False}) == "container exited with code 1"
    assert "unknown" in describe_exit(None)
