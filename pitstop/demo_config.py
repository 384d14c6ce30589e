"""The demo's settings for the control plane and the agent: plain data, written as YAML by ``pitstop.demo``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def server_config(demo_dir: Path, port: int, agent_token: str, operator_token: str) -> dict[str, object]:
    return {
        "host": "127.0.0.1",
        "port": port,
        "database_url": f"sqlite:///{demo_dir / 'db' / 'pitstop.db'}",
        "agent_tokens": [agent_token],
        "operator_tokens": [operator_token],
        "policy_interval_seconds": 2.0,
    }


def agent_config(
    state: Path, port: int, api_url: str, token: str, model: str, replica_ports: list[int],
    envs: Mapping[str, dict[str, str]], containers: Containers | None = None,
) -> dict[str, object]:
    replicas: list[dict[str, Any]] = [
        {
            "name": f"replica-{i}",
            "model": model,
            "engine": "sim",
            "port": p,
            "gpus": [i],
            "args": ["--max-num-seqs", "64", "--sim-gpu-dir", str(state / "simgpu")],
            # The demo's balancer polls readiness every half second: two seconds is plenty to notice.
            "drain_grace": 2.0,
            # The agent drains and stops its replicas together when the demo stops it: grace, drain and
            # stop fit within the demo's STOP_GRACE, so the engines end in order, not by SIGKILL.
            "drain_timeout": 3.0,
            "stop_timeout": 3.0,
            "env": dict(envs.get(f"replica-{i}", {})),
        }
        for i, p in enumerate(replica_ports)
    ]
    config: dict[str, object] = {
        "node": "demo-node-1",
        "host": "127.0.0.1",
        "port": port,
        "control_plane": api_url,
        "token": token,
        "report_interval": 2.0,
        "scrape_interval": 2.0,
        "process_interval": 2.0,
        "gpu_backend": "sim",
        "sim_gpu_count": len(replica_ports),
        "sim_gpu_dir": str(state / "simgpu"),
        "state_dir": str(state / "agent-demo-node-1"),
        "replicas": replicas,
    }
    if containers is not None:
        config |= {"docker_host": containers.docker_host, "container_gpus": "none"}
        for replica in replicas:
            replica |= {"runtime": "container", "image": containers.image, "pull": "never",
                        "volumes": list(containers.volumes), "env": {**replica["env"], **containers.env}}
    return config


@dataclass(frozen=True)
class Containers:
    """Engines in containers of the daemon on ``docker_host``: the image, what is mounted into every container,
    and what every engine is given besides its own ``env`` (a container inherits nothing of the agent's)."""

    docker_host: str
    image: str
    volumes: list[str]
    env: dict[str, str]
