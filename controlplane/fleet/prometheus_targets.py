"""Prometheus HTTP service discovery: the fleet as ``http_sd_config`` target groups (docs/design.md "Metrics").

Two jobs, chosen by the ``job`` query parameter:

- ``pitstop-agent``: one target per node, its agent's /metrics, labelled ``node``.
- ``pitstop-engines``: one target per replica, the engine's own /metrics passed through its agent
  (``/engines/<replica>/metrics``), labelled ``node``, ``replica``, ``model``, ``engine`` (vllm, sglang) and
  ``gpu``. Every series of that engine (``vllm:*``, ``sglang:*``) reaches Prometheus with those labels, so rules
  aggregate the engines' histograms and counters by model and join them with the agent's series by (node,
  replica). A data-parallel vLLM's own ``engine`` label (its rank) is kept as ``exported_engine``.

The address is the agent's, as it reported it; an agent listening on a wildcard address (0.0.0.0, ::) is
reached at the hostname it reported. Nodes that never reported an address have no target (they cannot be
scraped); stale nodes keep theirs, so Prometheus's ``up`` says they are down.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.store.models import Node, Replica
from engines import DEFAULT_ENGINE

Job = Literal["pitstop-agent", "pitstop-engines"]
JOBS: tuple[Job, ...] = ("pitstop-agent", "pitstop-engines")
_WILDCARDS = {"0.0.0.0", "::", "[::]", ""}


@dataclass(frozen=True)
class NodeAddress:
    name: str
    hostname: str
    agent_url: str | None


@dataclass(frozen=True)
class ReplicaPlace:
    node: str
    name: str
    model: str
    gpus: Sequence[int]
    engine: str = DEFAULT_ENGINE


def scrape_address(node: NodeAddress) -> str | None:
    """``host:port`` where Prometheus reaches the node's agent, or None when it never said."""
    if not node.agent_url:
        return None
    parts = urlsplit(node.agent_url)
    if not parts.netloc:
        return None
    host = parts.hostname or ""
    if host in _WILDCARDS or parts.netloc.startswith("[::]"):
        port = parts.port
        return f"{node.hostname}:{port}" if port else node.hostname
    return parts.netloc


def target_groups(job: Job, nodes: Iterable[NodeAddress], replicas: Iterable[ReplicaPlace]
                  ) -> list[dict[str, object]]:
    """The http_sd answer for ``job``: a list of ``{"targets": [...], "labels": {...}}``, sorted."""
    addresses = {n.name: a for n in nodes if (a := scrape_address(n)) is not None}
    if job == "pitstop-agent":
        return [{"targets": [addresses[name]], "labels": {"node": name}} for name in sorted(addresses)]
    groups: list[dict[str, object]] = []
    for replica in sorted(replicas, key=lambda r: (r.node, r.name)):
        address = addresses.get(replica.node)
        if address is None:
            continue
        groups.append({"targets": [address], "labels": {
            "__metrics_path__": f"/engines/{replica.name}/metrics",
            "node": replica.node, "replica": replica.name, "model": replica.model, "engine": replica.engine,
            "gpu": ",".join(str(g) for g in sorted(replica.gpus)),
        }})
    return groups


def read_targets(session: Session, job: Job) -> list[dict[str, object]]:
    """``target_groups`` over the store's nodes and replicas (two indexed reads, no history)."""
    nodes = [NodeAddress(name, hostname, url)
             for name, hostname, url in session.execute(select(Node.name, Node.hostname, Node.agent_url))]
    replicas: list[ReplicaPlace] = []
    if job == "pitstop-engines":
        replicas = [ReplicaPlace(node, name, model, [int(g) for g in gpus or []], engine)
                    for node, name, model, gpus, engine in session.execute(
                        select(Replica.node, Replica.name, Replica.model, Replica.gpus, Replica.engine_kind))]
    return target_groups(job, nodes, replicas)
