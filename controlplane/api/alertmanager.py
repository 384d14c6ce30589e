"""``POST /v1/alertmanager``: Alertmanager's webhook (payload version 4) in, alert rows out.

A team's Prometheus rules already say when a replica is unwell; this endpoint lets a policy's ``alert:``
condition act on them with Pitstop's guardrails. Each alert is mapped, by its labels, to what Pitstop knows: a
replica (``node`` + ``replica``, Pitstop's agent labels), a node (``node``), a replica or node by ``instance``
(host:port of a replica's URL or of the agent), or a model (``model``, vLLM's ``model_name``). An alert that
maps to nothing is kept as ``unmapped`` and listed, so a missing label shows instead of vanishing.

Rows are stored with policy ``alertmanager``: the notifier leaves them alone (Alertmanager pages for its own
alerts), and Alertmanager's fingerprint and ``startsAt`` identify one firing (the table's unique key), so a
repeat refreshes the row and a resolve closes it. The body is read by hand, as for agent reports, so that an
oversized payload is refused before it is buffered and every refusal is counted by reason; newer fields
(``truncatedAlerts`` and whatever comes later) are ignored, and a refused payload stores nothing.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import urlsplit

from fastapi import APIRouter, Request, status
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from controlplane.api.auth import AuthError
from controlplane.api.bodies import Rejected, read_body
from controlplane.api.context import AppContext, get_context
from controlplane.policy.snapshot import ALERTMANAGER_POLICY, UNMAPPED
from controlplane.remediation.alerting import FIRING, RESOLVED, fingerprint
from controlplane.security.roles import ON_BEHALF_OF_HEADER, Role
from controlplane.store.db import session_scope
from controlplane.store.models import AlertRow
from controlplane.store.models import Node as NodeRow
from controlplane.store.models import Replica as ReplicaRow

SUPPORTED_VERSIONS = frozenset({"4"})
# A group of a few thousand alerts; Alertmanager's ``max_alerts`` on the webhook keeps a larger one under it.
MAX_PAYLOAD_BYTES = 4 * 1024 * 1024
RESOLVED_BY_ALERTMANAGER = "resolved in Alertmanager"
# Two Alertmanagers of an HA pair may post the same new alert at once; the loser of the insert tries again.
WRITE_ATTEMPTS = 3
# Addresses that name a different machine on every host: never evidence of which node an alert is about.
_LOOPBACK_NAMES = frozenset({"localhost", "0.0.0.0", "::"})

router = APIRouter(tags=["alertmanager"])


class _Lenient(BaseModel):
    # Unknown fields are ignored: Alertmanager adds fields within version 4 (truncatedAlerts, ...).
    model_config = ConfigDict(extra="ignore", populate_by_name=True, hide_input_in_errors=True)


class AlertmanagerAlert(_Lenient):
    """One alert of the webhook payload, as Alertmanager sends it."""

    status: Literal["firing", "resolved"]
    labels: dict[str, str]
    annotations: dict[str, str] = Field(default_factory=dict)
    starts_at: AwareDatetime = Field(alias="startsAt")
    # Go's zero time (0001-01-01T00:00:00Z) when unknown.
    ends_at: AwareDatetime | None = Field(default=None, alias="endsAt")
    generator_url: str = Field(default="", alias="generatorURL")
    fingerprint: str = Field(default="", max_length=64)


class AlertmanagerPayload(_Lenient):
    """Alertmanager's webhook payload, version 4 (https://prometheus.io/docs/alerting/latest/configuration/)."""

    version: str = "4"
    group_key: str = Field(default="", alias="groupKey")
    truncated_alerts: int = Field(default=0, alias="truncatedAlerts")
    status: str = ""
    receiver: str = ""
    group_labels: dict[str, str] = Field(default_factory=dict, alias="groupLabels")
    common_labels: dict[str, str] = Field(default_factory=dict, alias="commonLabels")
    common_annotations: dict[str, str] = Field(default_factory=dict, alias="commonAnnotations")
    external_url: str = Field(default="", alias="externalURL")
    alerts: list[AlertmanagerAlert]


class ReceivedAlert(BaseModel):
    id: int
    fingerprint: str
    alertname: str
    status: Literal["firing", "resolved"]
    target: str


class AlertmanagerReceipt(BaseModel):
    """What was done with a payload: how many alerts mapped to a replica, node or model, and how many not."""

    received: int
    mapped: int
    unmapped: int
    created: int
    updated: int
    resolved: int
    alerts: list[ReceivedAlert]


def _payload_schema() -> dict[str, Any]:
    """The payload's JSON schema with the alert inlined (the route reads its body by hand)."""
    schema = AlertmanagerPayload.model_json_schema(by_alias=True)
    schema.pop("$defs", None)
    schema["properties"]["alerts"]["items"] = AlertmanagerAlert.model_json_schema(by_alias=True)
    return schema


# Reading the body -------------------------------------------------------------------------------------------

def parse_payload(body: bytes) -> AlertmanagerPayload:
    """The payload, or Rejected: 422 for a malformed one, 400 for a webhook version this server does not speak."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Rejected(422, "malformed", f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise Rejected(422, "malformed", "expected Alertmanager's webhook payload (a JSON object)")
    # Only a string is a version this server may not read; anything else (a list, an object) is malformed, and
    # validation names the field (422).
    if isinstance(data.get("version"), str) and data["version"] not in SUPPORTED_VERSIONS:
        raise Rejected(status.HTTP_400_BAD_REQUEST, "version",
                       f"unsupported webhook payload version {data['version']!r}; this control plane reads "
                       f"{', '.join(sorted(SUPPORTED_VERSIONS))}")
    try:
        payload = AlertmanagerPayload.model_validate(data)
    except ValidationError as exc:
        raise Rejected(422, "malformed", json.loads(exc.json(include_url=False, include_input=False))) from exc
    for i, alert in enumerate(payload.alerts):
        if alert.starts_at.year < 2:
            raise Rejected(422, "malformed", f"alerts[{i}].startsAt is Go's zero time: the alert never started")
    return payload


# Mapping labels to what Pitstop knows -----------------------------------------------------------------------

def _address(text: str) -> tuple[str, int | None] | None:
    """``host:port`` (an ``instance`` label) or a URL, as (lower-case host, port); None for loopback."""
    try:  # a report's URL or hostname may be anything ("[" is an invalid IPv6 URL): then it maps nothing
        parts = urlsplit(text if "//" in text else f"//{text}")
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError:
        return None
    if port is None and parts.scheme in ("http", "https"):
        port = 80 if parts.scheme == "http" else 443
    if not host or host in _LOOPBACK_NAMES:
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    return host, port


def _unique(pairs: Iterable[tuple[Any, str]]) -> dict[Any, str | None]:
    """Key -> value, with None for a key that two different values share (ambiguous: no mapping)."""
    out: dict[Any, str | None] = {}
    for key, value in pairs:
        out[key] = value if out.get(key, value) == value else None
    return out


@dataclass
class FleetIndex:
    """What alert labels are matched against, read once per payload."""

    replicas: set[tuple[str, str]] = field(default_factory=set)
    nodes: dict[str, str | None] = field(default_factory=dict)  # node name or hostname -> node
    models: set[str] = field(default_factory=set)
    replica_at: dict[tuple[str, int | None], str | None] = field(default_factory=dict)  # host:port -> target
    node_at: dict[tuple[str, int | None], str | None] = field(default_factory=dict)  # agent host:port -> node
    node_on: dict[str, str | None] = field(default_factory=dict)  # host -> node

    @classmethod
    def read(cls, session: Session) -> FleetIndex:
        nodes = list(session.execute(select(NodeRow.name, NodeRow.hostname, NodeRow.agent_url)))
        replicas = list(session.execute(select(ReplicaRow.node, ReplicaRow.name, ReplicaRow.model, ReplicaRow.url)))
        agent_at = [(a, name) for name, _, url in nodes if url and (a := _address(url)) is not None]
        engine_at = [(a, f"replica:{node}/{name}") for node, name, _, url in replicas
                     if url and (a := _address(url)) is not None]
        hosts = [(a[0], name) for name, hostname, _ in nodes if hostname and (a := _address(hostname)) is not None]
        hosts += [(a[0], name) for a, name in agent_at]
        by_name: dict[str, str | None] = {name: name for name, _, _ in nodes}
        return cls(
            replicas={(node, name) for node, name, _, _ in replicas},
            nodes={**_unique((hostname, name) for name, hostname, _ in nodes if hostname), **by_name},
            models={model for _, _, model, _ in replicas},
            replica_at=_unique(engine_at), node_at=_unique(agent_at), node_on=_unique(hosts),
        )

    def target(self, labels: dict[str, str]) -> str:
        """The most specific thing the labels name, or ``unmapped``.

        The labels present decide the level: an alert with ``node`` and ``replica`` is about that replica
        and maps to nothing else (a replica Pitstop does not know must not spill onto its whole node), one
        with ``node`` is about that node. ``instance`` then ``model``/``model_name`` come next.
        """
        node, replica = labels.get("node"), labels.get("replica")
        if node and replica:
            return f"replica:{node}/{replica}" if (node, replica) in self.replicas else UNMAPPED
        if node:
            found = self.nodes.get(node) or self.nodes.get(node.lower())
            return f"node:{found}" if found else UNMAPPED
        instance = labels.get("instance")
        address = _address(instance) if instance else None
        if address is not None:
            if (hit := self.replica_at.get(address)) is not None:
                return hit
            if (on := self.node_at.get(address) or self.node_on.get(address[0])) is not None:
                return f"node:{on}"
        model = labels.get("model") or labels.get("model_name")
        if model:
            return f"model:{model}" if model in self.models else UNMAPPED
        return UNMAPPED


# Storing ----------------------------------------------------------------------------------------------------

@dataclass
class _Tally:
    created: int = 0
    updated: int = 0
    resolved: int = 0
    alerts: list[ReceivedAlert] = field(default_factory=list)


def _ends(alert: AlertmanagerAlert, now: datetime) -> datetime:
    ends = alert.ends_at
    return now if ends is None or ends.year < 2 else ends.astimezone(UTC)


def store(session: Session, payload: AlertmanagerPayload, now: datetime) -> _Tally:
    """Write the payload's alerts: new firings as rows, repeats as refreshes, resolves as closed rows."""
    fleet = FleetIndex.read(session)
    tally = _Tally()
    for alert in payload.alerts:
        target = fleet.target(alert.labels)
        labels: dict[str, Any] = dict(alert.labels)
        if "target" in labels and labels["target"] != target:
            labels["exported_target"] = labels["target"]  # the sender's own ``target`` label, kept
        labels["target"] = target
        annotations: dict[str, Any] = {**alert.annotations, "generator_url": alert.generator_url}
        key = alert.fingerprint or fingerprint(alert.labels)
        starts = alert.starts_at.astimezone(UTC)
        severity = (alert.labels.get("severity") or "warning")[:16]
        row = session.scalars(select(AlertRow).where(AlertRow.fingerprint == key, AlertRow.starts_at == starts,
                                                     AlertRow.policy == ALERTMANAGER_POLICY)).first()
        if row is None:
            resolved = alert.status == RESOLVED
            row = AlertRow(fingerprint=key, labels=labels, annotations=annotations, severity=severity,
                           state=RESOLVED if resolved else FIRING, starts_at=starts,
                           ends_at=_ends(alert, now) if resolved else None, action_id=None, updated_at=now,
                           policy=ALERTMANAGER_POLICY, last_seen_at=now,
                           resolved_reason=RESOLVED_BY_ALERTMANAGER if resolved else "")
            session.add(row)
            if not resolved:
                _supersede(session, key, starts, now)
            session.flush()
            tally.created += 1
            tally.resolved += resolved
        else:
            row.labels, row.annotations, row.severity = labels, annotations, severity
            row.last_seen_at = row.updated_at = now
            if alert.status == RESOLVED and row.state == FIRING:
                row.state, row.ends_at, row.resolved_reason = RESOLVED, _ends(alert, now), RESOLVED_BY_ALERTMANAGER
                tally.resolved += 1
            elif alert.status == FIRING and row.state == RESOLVED and row.resolved_reason == RESOLVED_BY_ALERTMANAGER:
                # Alertmanager resolved it (its resolve_timeout passed) and Prometheus sent it again: the same
                # firing goes on. A row resolved by an operator stays so until the alert fires anew.
                row.state, row.ends_at, row.resolved_reason = FIRING, None, ""
            session.flush()
            tally.updated += 1
        tally.alerts.append(ReceivedAlert(id=row.id, fingerprint=key, alertname=alert.labels.get("alertname", ""),
                                          status=alert.status, target=target))
    return tally


def _supersede(session: Session, key: str, starts: datetime, now: datetime) -> None:
    """An older firing of the same alert whose resolve never arrived ends where the new one starts."""
    for old in session.scalars(select(AlertRow).where(AlertRow.fingerprint == key, AlertRow.state == FIRING,
                                                      AlertRow.policy == ALERTMANAGER_POLICY,
                                                      AlertRow.starts_at < starts)):
        old.state, old.ends_at, old.updated_at = RESOLVED, starts, now
        old.resolved_reason = "Alertmanager's alert fired anew"


def _write(ctx: AppContext, payload: AlertmanagerPayload) -> _Tally:
    for attempt in range(WRITE_ATTEMPTS):
        try:
            with session_scope(ctx.sessions) as session:
                return store(session, payload, ctx.clock())
        except IntegrityError:
            if attempt == WRITE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


@router.post(
    "/v1/alertmanager",
    response_model=AlertmanagerReceipt,
    summary="Accept Alertmanager's webhook: its alerts, mapped to replicas, nodes or models",
    openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _payload_schema()}}}},
    responses={400: {"description": "unsupported webhook payload version"},
               401: {"description": "alertmanager token missing"},
               403: {"description": "not an alertmanager token"},
               413: {"description": "payload too large"}, 422: {"description": "malformed payload"}},
)
async def post_alerts(request: Request) -> AlertmanagerReceipt:
    ctx = get_context(request)
    try:
        # The on-behalf-of header is passed on to be refused: Alertmanager never acts for anyone.
        await run_in_threadpool(ctx.auth.require, request.headers.get("authorization"), Role.ALERTMANAGER,
                                on_behalf_of=request.headers.getlist(ON_BEHALF_OF_HEADER))
        payload = parse_payload(await read_body(request, MAX_PAYLOAD_BYTES, "payload"))
    except Rejected as exc:
        ctx.telemetry.reject_alertmanager(exc.reason)
        raise
    except AuthError as exc:
        ctx.telemetry.reject_alertmanager("unauthorized" if exc.status_code == 401 else "forbidden")
        raise
    tally = await run_in_threadpool(_write, ctx, payload)
    for received in tally.alerts:
        ctx.telemetry.alertmanager_alerts.labels(target=received.target.partition(":")[0]).inc()
    request.app.state.jobs.poke()  # a policy's alert condition may hold now
    unmapped = sum(1 for a in tally.alerts if a.target == UNMAPPED)
    return AlertmanagerReceipt(received=len(tally.alerts), mapped=len(tally.alerts) - unmapped, unmapped=unmapped,
                               created=tally.created, updated=tally.updated, resolved=tally.resolved,
                               alerts=tally.alerts)
