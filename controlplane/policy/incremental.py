"""``Evaluator``: a round that evaluates only what changed, and proposes exactly what ``evaluate`` would. Pure.

At 1,000 nodes a round that judges every replica and GPU under every policy costs seconds, while between two
rounds only the subjects whose node reported have anything new (docs/design.md, "Rounds at fleet scale"). The
evaluator remembers, per policy and subject, that the last look found nothing, with what it looked at (the
subject's fields and the span of its history: ``_mark``) and the next moment time alone could change the answer
(``_recheck``). A subject is judged again when its mark moved, when that moment came, or when the last look
found something (a finding's figures move with the clock: it is never reused). Everything else about a round
is as ``evaluate`` does it: the same scopes, in the same order, the same ``actions_for``.

When time alone changes an answer, for detectors that read samples inside windows ending now: when a sample
leaves one of the condition's windows (``for``, ``within``, ``lookback``), which is also when a history too short
to anchor a ``for`` first covers it; when the newest sample turns stale; when ``for`` has passed since the
replica's state began (a WEDGED engine's stall); and, for a leak, when the trend's time to the limit comes within
the horizon (``leak_due``). Conditions whose answer can move otherwise are judged every round: Alertmanager's
alerts, silent nodes (both cheap: no histories), and the max-num-seqs governor, which judges a model's replicas
together (any report of the model is news to it).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import (
    Condition,
    CrashLoopCondition,
    EccCondition,
    ErrorRateCondition,
    LeakCondition,
    OomCrashCondition,
    StallCondition,
    ThermalCondition,
    ThresholdCondition,
    XidCondition,
)
from controlplane.policy.detectors.findings import STALE_AFTER_SECONDS, Finding
from controlplane.policy.detectors.leak import judge_leak
from controlplane.policy.evaluate import (
    GPU_CONDITIONS,
    actions_for,
    detect_gpu,
    detect_replica,
    evaluate_policy,
    in_scope_gpus,
    in_scope_replicas,
)
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.screens import screen
from controlplane.policy.shards import Part, judged_by_nodes
from controlplane.policy.snapshot import FleetSnapshot, Gpu, Replica

REPLICA_CONDITIONS = (ThresholdCondition, ErrorRateCondition, StallCondition, LeakCondition, CrashLoopCondition,
                      OomCrashCondition)
_STALE = timedelta(seconds=STALE_AFTER_SECONDS)


class _Inputs:
    """What a quiet answer's ``until`` is worked out from, kept until a later round needs it."""

    # A plain class with slots: one is made per subject and policy judged quiet (tens of thousands in a round where
    # every node of 1,000 reported), and a frozen dataclass costs several times more to make.
    __slots__ = ("cond", "history", "key", "leak_due", "since")

    def __init__(self, cond: Condition, history: Sequence[Any], since: datetime | None, key: str,
                 leak_due: datetime | None) -> None:
        self.cond = cond
        self.history = history
        self.since = since
        self.key = key
        self.leak_due = leak_due  # a serving replica under a leak condition: ``leak_due`` at the look


class _Quiet:
    """A subject on which a policy found nothing: which version of it was looked at, when, and until when that
    holds (None: until the subject changes). ``until`` is worked out only when a later round finds the same
    version (``pending`` until then): where every node reports between two rounds, nearly every answer is
    judged again anyway, and working out when each would have expired cost a third of such a round."""

    __slots__ = ("at", "pending", "until", "version")

    def __init__(self, version: int, at: datetime, until: datetime | None, pending: _Inputs | None = None) -> None:
        self.version = version
        self.at = at
        self.until = until
        self.pending = pending


def _history_span(history: Sequence[Any]) -> tuple[Any, ...]:
    # A history gains samples at its end (or, reported late, inside) and loses them at its start: its length and
    # both ends tell every change apart.
    return (len(history), history[0].at, history[-1].at) if history else (0,)


def _replica_mark(replica: Replica, snapshot: FleetSnapshot) -> tuple[Any, ...]:
    """Everything a replica detector reads of one replica: its fields, its history's span, and a leak's limit
    (the host's memory, or its GPUs')."""
    node = snapshot.node(replica.node)
    return (*(v for k, v in replica.__dict__.items() if k != "history"), *_history_span(replica.history),
            None if node is None else node.memory_total_bytes,
            tuple(g.memory_total_bytes for g in snapshot.gpus_of(replica)))


def _gpu_mark(gpu: Gpu) -> tuple[Any, ...]:
    return (*(v for k, v in gpu.__dict__.items() if k != "history"), *_history_span(gpu.history))


class _Versions:
    """A version per subject, moved whenever what the detectors read of it changed since the last round."""

    def __init__(self) -> None:
        self._marks: dict[str, tuple[Any, ...]] = {}
        self._versions: dict[str, int] = {}
        self._last = 0  # versions are never reused: a subject that left and came back is new

    def update(self, marks: dict[str, tuple[Any, ...]]) -> None:
        versions = {}
        for key, mark in marks.items():
            version = self._versions.get(key)
            if version is None or self._marks.get(key) != mark:
                self._last += 1
                version = self._last
            versions[key] = version
        self._marks, self._versions = marks, versions

    def __getitem__(self, key: str) -> int:
        return self._versions[key]


def _windows(cond: Condition) -> tuple[float, ...]:
    if isinstance(cond, ThresholdCondition | ErrorRateCondition | StallCondition | ThermalCondition):
        return (cond.for_,)
    if isinstance(cond, XidCondition | EccCondition):
        return (cond.within,)
    if isinstance(cond, LeakCondition):
        return (cond.lookback,)
    return ()


def _at(sample: Any) -> datetime:
    at: datetime = sample.at
    return at


def _recheck(cond: Condition, history: Sequence[Any], since: datetime | None, now: datetime, key: str,
             moments: dict[tuple[str, float], datetime | None]) -> datetime | None:
    """The first moment, at or after ``now``, from which time alone could change what ``cond`` finds on a subject
    with this history (None: only a new input can). A moment equal to ``now`` means "any later round": window
    bounds are inclusive in some detectors and exclusive in others, so each edge counts from the instant it is
    reached. ``moments``: this round's answers by subject and window, shared by the policies."""
    found: list[datetime | None] = [_moment(history, since, now, key, -1.0, moments)]
    found += [_moment(history, since, now, key, window, moments) for window in _windows(cond)]
    known = [m for m in found if m is not None]
    return min(known) if known else None


def _moment(history: Sequence[Any], since: datetime | None, now: datetime, key: str, window: float,
            moments: dict[tuple[str, float], datetime | None]) -> datetime | None:
    """The first moment at or after ``now`` one window (``window`` < 0: none, the history's own edges) changes."""
    if (key, window) in moments:
        return moments[(key, window)]
    found: list[datetime] = []
    if window < 0:
        if history:
            found.append(history[-1].at + _STALE)  # the newest sample turns stale
            ahead = bisect_right(history, now, key=_at)
            if ahead < len(history):  # stamped after this round's clock (a skewed agent): it enters later
                found.append(history[ahead].at)
    else:
        span = timedelta(seconds=window)
        # The oldest sample still inside the window leaves it next (and a history too short for a ``for`` first
        # covers it then).
        first = bisect_left(history, now - span, key=_at)
        if first < len(history):
            found.append(history[first].at + span)
        if since is not None:  # ``for`` since the replica's state began (a WEDGED verdict held long enough)
            found.append(since + span)
    later = [m for m in found if m >= now]
    moments[(key, window)] = min(later) if later else None
    return moments[(key, window)]


class Evaluator:
    """``evaluate`` across rounds, judging again only the subjects whose answer may have changed."""

    def __init__(self) -> None:
        # By the policy object: a changed file loads new objects, whose answers are not known yet.
        self._quiet: dict[int, tuple[Policy, dict[str, _Quiet]]] = {}
        self._replicas = _Versions()
        self._gpus = _Versions()
        # ``_recheck``'s answers by the round they are for, shared by the policies (one subject, one window).
        self._moments: dict[datetime, dict[tuple[str, float], datetime | None]] = {}
        self.judged = 0  # subjects judged by the last round
        self.reused = 0  # known quiet from an earlier round
        self.screened = 0  # told quiet by their fields or newest reading (``screens``)
        self.primed = False  # a round has judged every subject since this was made or cleared

    def clear(self) -> None:
        self.primed = False
        self._quiet.clear()
        self._replicas = _Versions()
        self._gpus = _Versions()

    def evaluate(self, policies: Sequence[Policy], snapshot: FleetSnapshot, now: datetime,
                 part: Part | None = None) -> list[ProposedAction]:
        """What ``evaluate(policies, snapshot, now, part)`` returns, in the same order. The part may change
        between rounds (shards taken over or handed on): subjects new to it are judged afresh."""
        part = part or Part.whole()
        policies = part.policies(policies)
        models = part.models_view(snapshot)
        kept = {id(p): (p, known[1] if (known := self._quiet.get(id(p))) and known[0] is p else {})
                for p in policies}
        self._quiet = kept
        self.judged = self.reused = self.screened = 0
        self._replicas.update({r.key: _replica_mark(r, snapshot) for r in models.replicas})
        self._gpus.update({g.key: _gpu_mark(g) for g in snapshot.gpus} if part.nodes else {})
        self._moments.clear()
        out: list[ProposedAction] = []
        for policy in policies:
            cond = policy.condition
            if not policy.enabled:
                continue
            view = snapshot if judged_by_nodes(policy) else models
            if isinstance(policy.action, LowerMaxNumSeqsAction) or not isinstance(
                    cond, REPLICA_CONDITIONS + GPU_CONDITIONS):
                out += evaluate_policy(policy, view, now)
                continue
            found = self._detect(policy, view, now, kept[id(policy)][1])
            out += actions_for(policy, found, view)
        self.primed = True
        return out

    def _settle(self, known: _Quiet) -> _Quiet:
        """``known`` with its ``until``: the first moment after its look that time alone could change it."""
        inputs = known.pending
        assert inputs is not None
        moments = self._moments.setdefault(known.at, {})
        until = _recheck(inputs.cond, inputs.history, inputs.since, known.at, inputs.key, moments)
        due = inputs.leak_due
        if due is not None and (until is None or due < until):
            until = due
        return _Quiet(known.version, known.at, until)

    def _detect(self, policy: Policy, snapshot: FleetSnapshot, now: datetime,
                quiet: dict[str, _Quiet]) -> list[Finding]:
        cond = policy.condition
        found: list[Finding] = []
        subjects: Sequence[Replica | Gpu]
        if isinstance(cond, GPU_CONDITIONS):
            subjects, versions, prefix = in_scope_gpus(policy, snapshot), self._gpus, "gpu:"
        else:
            subjects, versions, prefix = in_scope_replicas(policy, snapshot), self._replicas, "replica:"
        calm = screen(cond, now)
        leaks = isinstance(cond, LeakCondition)
        kept: dict[str, _Quiet] = {}  # this round's quiet answers: those of subjects gone or screened are dropped
        for subject in subjects:
            if calm is not None and calm(subject):
                self.screened += 1
                continue
            key = subject.key
            version = versions[key]
            known = quiet.get(key)
            if known is not None and known.version == version and known.at <= now:
                if known.pending is not None:
                    known = self._settle(known)
                if known.until is None or now < known.until:
                    self.reused += 1
                    kept[key] = known
                    continue
            self.judged += 1
            due = None
            if isinstance(subject, Gpu):
                finding = detect_gpu(cond, subject, now)
                since = None
            elif leaks and subject.serving:
                assert isinstance(cond, LeakCondition)
                finding, due = judge_leak(cond, subject, snapshot, now)  # ``detect_replica``'s, and its moment
                since = subject.state_since
            else:
                finding = detect_replica(cond, subject, snapshot, now)
                since = subject.state_since
            if finding is not None:
                found.append(finding)
                continue
            kept[key] = _Quiet(version, now, None, _Inputs(cond, subject.history, since, prefix + key, due))
        quiet.clear()
        quiet.update(kept)
        return found
