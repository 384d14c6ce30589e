"""``build_snapshot``: the policy engine's ``FleetSnapshot`` read from the store in a few bulk queries.

Latest state comes from the nodes, gpus and replicas tables; histories from the leader's ``SampleHistory``
cache, or (for one-off snapshots such as explain) from the samples table over ``history``, one query per
subject kind grouped in Python: per-replica queries would be 8,000 round trips. Alertmanager's firing alerts
(alert rows of policy ``alertmanager``) come along for the ``alert`` condition.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Text, cast, select
from sqlalchemy.orm import Session

from agent.wire import ReplicaState
from controlplane.policy.kinds import ActionKind
from controlplane.policy.lifecycle import ActionState
from controlplane.policy.live_cap import reported
from controlplane.policy.payloads import AddEngineFlagPayload, CorruptPayload, parse_payload
from controlplane.policy.signals import from_stored
from controlplane.policy.snapshot import (
    ALERTMANAGER_POLICY,
    UNMAPPED,
    ExternalAlert,
    FlagTrial,
    FleetSnapshot,
    Gpu,
    GpuReading,
    Node,
    Replica,
    ReplicaSample,
    construct,
)
from controlplane.remediation.history import SampleHistory, gpu_reading
from controlplane.store.models import ActionRow, AlertRow, DesiredReplica
from controlplane.store.models import Gpu as GpuRow
from controlplane.store.models import Node as NodeRow
from controlplane.store.models import Replica as ReplicaRow
from controlplane.store.samples import series_of
from engines import ADAPTERS, DEFAULT_ENGINE

Point = tuple[datetime, dict[str, Any]]
# How far back taken-back flag rungs are read (a rung's retry_after is at most this useful).
TRIALS_LOOKBACK = timedelta(days=1)


def _histories(session: Session, kind: str, since: datetime,
               models: set[tuple[str, str]] | None) -> dict[tuple[str, str], list[Point]]:
    found = series_of(session, kind=kind, since=since)
    return found if models is None else {key: points for key, points in found.items() if key in models}


_R = ReplicaRow.__table__.c
_G = GpuRow.__table__.c

# The replicas' JSON columns as their text, decoded here: the same few texts recur across a fleet (one model's
# arguments on each of its replicas, its GPU lists, an inactive plug-in), and each is decoded once (``_Decoded``).
def _text(column: Any) -> Any:
    return cast(column, Text).label(column.name)


_REPLICA_COLUMNS = (_R.node, _R.name, _R.model, _text(_R.gpus), _R.state, _R.ready, _R.managed, _R.state_since,
                    _text(_R.engine_args), _R.generation, _R.restarts_total, _R.last_exit_code, _R.log_tail,
                    _text(_R.live_limits), _R.engine_kind)
# Unpacked, not read as attributes: a result row's ``index`` is tuple.index.
_GPU_COLUMNS = (_G.node, _G.index, _G.uuid, _G.name, _G.readings)
# Nodes per query when reading the rows of those that reported (bounded IN lists).
_NODES_PER_READ = 500


class FleetRows:
    """The leader's copy of the replicas' and GPUs' latest rows, read again only for the nodes that reported
    since (a node's rows change only with its reports, which also move its ``last_report_at`` and sequence),
    and of the snapshot's objects built from them, built again only for the nodes whose inputs changed.

    At 1,000 nodes reading and decoding every row was most of a round's snapshot (40,000 JSON columns); a
    round now decodes the rows of the nodes that reported since the last one. The node list is read whole each
    round (cordons, memory and report times are the nodes' own), and so are the desired generations and live
    caps (operators and rollouts change them without a report). A node whose marker is read before its rows is
    read again next round if a report landed in between, so nothing is missed.

    A node's ``Node``, ``Replica`` and ``Gpu`` objects are kept with what they were built from (its node row,
    its marker, its replicas' desired generations and caps) and reused by the next snapshot while all of it is
    unchanged and the history cache touched none of its histories (``SampleHistory.take_touched``): a round
    then builds the objects of the nodes that reported or whose oldest sample aged out, not 17,000 of them.
    The whole node is built again when any part of it changed, so a reused replica comes with the very node and
    GPU objects it was judged with (``incremental.Evaluator`` relies on that: docs/design.md, "Rounds at fleet
    scale")."""

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[Any, list[Any], list[Any]]] = {}  # name -> (marker, replica rows, GPU rows)
        self._built: dict[str, tuple[Any, Node, list[Replica], list[Gpu]]] = {}  # name -> (inputs, objects)
        self._history: SampleHistory | None = None  # the cache the kept objects' histories came from
        self.read_nodes = 0  # nodes whose rows the last refresh read
        self.node_rows: list[Any] | None = None  # the nodes' rows the last snapshot was built from, in order
        self.built_nodes = 0  # nodes whose objects the last snapshot built (the others were reused)

    def clear(self) -> None:
        self._nodes.clear()
        self._built.clear()
        self._history = None
        self.node_rows = None

    def with_nodes(self, fresh: Sequence[Any]) -> list[Any]:
        """The last snapshot's node rows, in their order, with ``fresh`` ones in place of those of the same names (a
        node new since goes last, until the next whole read puts it in the database's order)."""
        assert self.node_rows is not None
        by_name = {n.name: n for n in fresh}
        kept = [by_name.pop(n.name, n) for n in self.node_rows]
        return kept + list(by_name.values())

    def refresh(self, session: Session, markers: dict[str, Any]) -> None:
        stale = [name for name, marker in markers.items()
                 if (known := self._nodes.get(name)) is None or known[0] != marker]
        for name in [n for n in self._nodes if n not in markers]:
            del self._nodes[name]  # forgotten: gone with its rows
        fresh: dict[str, tuple[Any, list[Any], list[Any]]] = {name: (markers[name], [], []) for name in stale}
        for i in range(0, len(stale), _NODES_PER_READ):
            part = stale[i:i + _NODES_PER_READ]
            for row in session.execute(select(*_REPLICA_COLUMNS).where(_R.node.in_(part))):
                fresh[row.node][1].append(row)
            for gpu in session.execute(select(*_GPU_COLUMNS).where(_G.node.in_(part))):
                fresh[gpu[0]][2].append(gpu)
        self._nodes.update(fresh)
        self.read_nodes = len(stale)

    def replicas(self, model: str | None) -> list[Any]:
        return _in_order([r for _, replicas, _ in self._nodes.values() for r in replicas
                          if model is None or r.model == model])

    def gpus(self) -> list[Any]:
        return _in_order([g for _, _, gpus in self._nodes.values() for g in gpus])

    def assemble(self, node_rows: Sequence[Any], desired: dict[tuple[str, str], tuple[Any, Any]],
                 samples: SampleHistory, since: datetime) -> tuple[list[Node], list[Replica], list[Gpu]]:
        """The snapshot's nodes (in ``node_rows``' order), replicas and GPUs (by node, then name or index), with
        histories from ``samples`` (refreshed, and so trimmed, to ``since``), reusing every unchanged node's
        objects."""
        if samples is not self._history:
            self._built.clear()  # objects whose histories came from another cache
            self._history = samples
        touched = samples.take_touched()
        built: dict[str, tuple[Any, Node, list[Replica], list[Gpu]]] = {}
        nodes: list[Node] = []
        self.built_nodes = 0
        for n in node_rows:
            name = n.name
            _, replica_rows, gpu_rows = self._nodes[name]
            inputs = (tuple(n), tuple(desired.get((name, r.name)) for r in replica_rows))
            kept = self._built.get(name)
            if kept is None or kept[0] != inputs or name in touched:
                kept = (inputs, _node(n), *self._objects(name, replica_rows, gpu_rows, desired, samples, since))
                self.built_nodes += 1
            built[name] = kept
            nodes.append(kept[1])
        self._built = built
        in_order = sorted(built)  # Python's order, as ``_in_order`` sorts, whatever the database's collation
        return (nodes, [r for name in in_order for r in built[name][2]],
                [g for name in in_order for g in built[name][3]])

    @staticmethod
    def _objects(node: str, replica_rows: list[Any], gpu_rows: list[Any],
                 desired: dict[tuple[str, str], tuple[Any, Any]], samples: SampleHistory,
                 since: datetime) -> tuple[list[Replica], list[Gpu]]:
        replicas = [_replica(r, desired.get((node, r.name), (None, None)), samples.replica(node, r.name, since))
                    for r in sorted(replica_rows, key=lambda r: r[1])]
        gpus = [_gpu(g, samples.gpu(node, g[1], since)) for g in sorted(gpu_rows, key=lambda g: g[1])]
        return replicas, gpus


class _Decoded:
    """JSON texts decoded once each, for as long as this many distinct ones have not been asked for since: shared
    values, so a caller copies what it keeps (lists) or keeps only what is immutable (a ``LiveLimits``)."""

    def __init__(self, decode: Callable[[str], Any], size: int = 4_096) -> None:
        self._decode, self._size = decode, size
        self._known: dict[str, Any] = {}

    def __call__(self, text: str | None) -> Any:
        if text is None:
            return None
        try:
            return self._known[text]
        except KeyError:
            if len(self._known) >= self._size:
                self._known.clear()  # a fleet whose texts do not recur (it starts afresh, and stays correct)
            value = self._known[text] = self._decode(text)
            return value


_json = _Decoded(json.loads)
_live_limits = _Decoded(lambda text: reported(json.loads(text)))


def _node(n: Any) -> Node:
    return construct(Node, name=n.name, cordoned=n.cordoned, cordoned_gpus=list(n.cordoned_gpus or []),
                     memory_total_bytes=n.memory_total_bytes, last_report_at=n.last_report_at)


def _replica(r: Any, wanted: tuple[Any, Any], history: list[ReplicaSample]) -> Replica:
    wanted_generation, wanted_cap = wanted
    return construct(
        Replica, node=r.node, labels={}, name=r.name, model=r.model, gpus=list(_json(r.gpus)),
        state=ReplicaState(r.state), ready=r.ready, managed=r.managed, state_since=r.state_since,
        engine_args=list(_json(r.engine_args)), generation=r.generation, desired_generation=wanted_generation,
        restarts_total=r.restarts_total, last_exit_code=r.last_exit_code,
        log_tail=list(r.log_tail), history=history,
        live_limits=_live_limits(r.live_limits), desired_live_cap=wanted_cap,
        engine_kind=r.engine_kind if r.engine_kind in ADAPTERS else DEFAULT_ENGINE,
    )


def _gpu(row: Any, history: list[GpuReading]) -> Gpu:
    node, index, uuid, name, readings = row
    return construct(
        Gpu, node=node, index=index, uuid=uuid, name=name,
        slowdown_temperature_celsius=readings.get("slowdown_temperature_celsius"),
        memory_used_bytes=readings.get("memory_used_bytes"),
        memory_total_bytes=readings.get("memory_total_bytes"),
        throttle_reasons=list(readings.get("throttle_reasons") or []),
        xid_events_total=int(readings.get("xid_events_total") or 0), last_xid=readings.get("last_xid"),
        history=history,
    )


def _in_order(rows: list[Any]) -> list[Any]:
    """Rows by node, then replica name or GPU index: sorted here, not by the database, so the order is the same
    whichever way they were read and whatever the database's collation."""
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows


def _read_rows(session: Session, model: str | None) -> tuple[list[Any], list[Any] | None]:
    replica_query = select(*_REPLICA_COLUMNS)
    if model is not None:
        replica_query = replica_query.where(_R.model == model)
    gpus = None if model is not None else _in_order(list(session.execute(select(*_GPU_COLUMNS))))
    return _in_order(list(session.execute(replica_query))), gpus


def _built_whole(session: Session, since: datetime, use_history: bool, model: str | None,
                 samples: SampleHistory | None, rows: FleetRows | None, node_rows: Sequence[Any],
                 desired: dict[tuple[str, str], tuple[Any, Any]]) -> tuple[list[Node], list[Replica], list[Gpu]]:
    """Every object built afresh: one-off snapshots (explain, an operator's model view) and history windows
    other than the cache's."""
    nodes = [_node(n) for n in node_rows]
    if rows is not None:
        replica_rows, gpu_rows = rows.replicas(model), None if model is not None else rows.gpus()
    else:
        replica_rows, gpu_rows = _read_rows(session, model)
    stored: dict[tuple[str, str], list[Point]] = {}
    if use_history and samples is None:
        stored = _histories(session, "replica", since,
                            {(r.node, r.name) for r in replica_rows} if model else None)

    def replica_history(node: str, name: str) -> list[ReplicaSample]:
        if not use_history:
            return []
        if samples is not None:
            return samples.replica(node, name, since)
        return [from_stored(at, v) for at, v in stored.get((node, name), [])]

    replicas = [_replica(r, desired.get((r.node, r.name), (None, None)), replica_history(r.node, r.name))
                for r in replica_rows]
    if gpu_rows is None:
        return nodes, replicas, []
    gpu_stored = _histories(session, "gpu", since, None) if use_history and samples is None else {}

    def gpu_history(node: str, index: int) -> list[GpuReading]:
        if not use_history:
            return []
        if samples is not None:
            return samples.gpu(node, index, since)
        return [gpu_reading(at, v) for at, v in gpu_stored.get((node, str(index)), [])]

    return nodes, replicas, [_gpu(g, gpu_history(g[0], g[1])) for g in gpu_rows]


def build_snapshot(*, session: Session, now: datetime, history: timedelta = timedelta(minutes=15),
                   model: str | None = None, samples: SampleHistory | None = None,
                   rows: FleetRows | None = None, only: set[str] | None = None) -> FleetSnapshot:
    """The fleet at ``now`` with ``history`` of samples; ``model`` limits replicas to one model (no GPUs then).

    With ``samples`` (the leader's cache) histories come from memory after reading only the new rows;
    without, from the samples table. With ``rows`` (the leader's copy of the latest rows) only the nodes that
    reported since are read. Latest state is read with plain column queries: at 8,000 replicas the ORM's
    per-object bookkeeping cost more than the database did.

    ``only`` (with both caches, after a snapshot built from them): what is new is read of these nodes alone, and
    every other node is as that snapshot read it (an urgent round: ``rounds.PolicyRounds.run_urgent``).
    """
    since = now - history
    use_history = history > timedelta(0)
    partial = only is not None and rows is not None and rows.node_rows is not None and samples is not None
    if only is not None and not partial:
        raise ValueError("a snapshot of some nodes' news needs the leader's caches, read once already")
    if samples is not None and use_history:
        if partial:
            samples.refresh(session, now, only)
        else:
            samples.refresh(session, now)
    query = select(NodeRow.name, NodeRow.cordoned, NodeRow.cordoned_gpus, NodeRow.memory_total_bytes,
                   NodeRow.last_report_at, NodeRow.last_sequence).order_by(NodeRow.name)
    if partial and rows is not None and only is not None:
        node_rows = rows.with_nodes(session.execute(query.where(NodeRow.name.in_(sorted(only)))).all())
    else:
        node_rows = list(session.execute(query).all())
    if rows is not None:
        rows.refresh(session, {n.name: (n.last_report_at, n.last_sequence) for n in node_rows})
        rows.node_rows = node_rows
    desired = {(node, name): (generation, cap) for node, name, generation, cap in session.execute(
        select(DesiredReplica.node, DesiredReplica.name, DesiredReplica.generation, DesiredReplica.live_cap))}
    if rows is not None and samples is not None and use_history and model is None and history == samples.horizon:
        # The leader's rounds: the cache was trimmed to ``since`` by its refresh, so a kept node's histories are
        # still exactly its window.
        nodes, replicas, gpus = rows.assemble(node_rows, desired, samples, since)
    else:
        nodes, replicas, gpus = _built_whole(session, since, use_history, model, samples, rows, node_rows, desired)
    # Constructed, not validated: every part was validated on its way into the store, and validating
    # 8,000 replicas' histories would hold the interpreter for seconds while reports wait.
    return FleetSnapshot.model_construct(now=now, nodes=nodes, gpus=gpus, replicas=replicas,
                                         flag_trials=flag_trials(session, now),
                                         external_alerts=external_alerts(session))


def flag_trials(session: Session, now: datetime) -> list[FlagTrial]:
    """Flag rungs the governor tried and took back (canary rolled back, or the rollout failed) lately."""
    rows = session.execute(select(ActionRow.model, ActionRow.params, ActionRow.state, ActionRow.outcome,
                                  ActionRow.updated_at)
                           .where(ActionRow.kind == ActionKind.ADD_ENGINE_FLAG.value,
                                  ActionRow.state.in_((ActionState.ROLLED_BACK.value, ActionState.FAILED.value)),
                                  ActionRow.updated_at >= now - TRIALS_LOOKBACK))
    trials = []
    for model, params, state, outcome, at in rows:
        try:
            rung = parse_payload(ActionKind.ADD_ENGINE_FLAG, params)
        except CorruptPayload:
            continue  # its own action failed with the reason; a rung it cannot name was never tried
        if model is not None and isinstance(rung, AddEngineFlagPayload):
            trials.append(FlagTrial(model=model, flag=rung.flag, value=rung.value, at=_aware(at),
                                    outcome=f"{state}: {outcome}"[:300]))
    return trials


def external_alerts(session: Session) -> list[ExternalAlert]:
    """Alertmanager's alerts firing now, with the target their labels mapped to when they were posted."""
    rows = session.execute(select(AlertRow.fingerprint, AlertRow.labels, AlertRow.annotations, AlertRow.severity,
                                  AlertRow.starts_at)
                           .where(AlertRow.policy == ALERTMANAGER_POLICY, AlertRow.state == "firing")
                           .order_by(AlertRow.starts_at, AlertRow.id))
    out = []
    for fingerprint, stored_labels, notes, severity, starts_at in rows:
        labels = {str(k): str(v) for k, v in (stored_labels or {}).items() if v is not None}
        summary = (notes or {}).get("summary") or (notes or {}).get("description") or ""
        out.append(ExternalAlert(alertname=labels.get("alertname", ""), target=labels.get("target", UNMAPPED),
                                 starts_at=_aware(starts_at), labels=labels, fingerprint=fingerprint,
                                 severity=severity or "", summary=str(summary)[:500]))
    return out


def _aware(at: datetime) -> datetime:
    return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
