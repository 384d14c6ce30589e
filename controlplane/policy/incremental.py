"""``Evaluator``: a round that evaluates only what changed, and proposes exactly what ``evaluate`` would. Pure.

At 1,000 nodes a round that judges every replica and GPU under every policy costs seconds, while between two
rounds only the subjects whose node reported have anything new (docs/design.md, "Rounds at fleet scale"). The
evaluator remembers, per policy and subject, that the last look found nothing, with what it looked at (the
subject's fields and the span of its history: ``versions``) and the next moment time alone could change the answer
(``recheck``). A subject is judged again when its mark moved, when that moment came, or when the last look
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

from collections.abc import Sequence
from datetime import datetime
from heapq import heapify, heappop, heappush
from typing import Any

from controlplane.policy.actions import LowerMaxNumSeqsAction
from controlplane.policy.conditions import (
    Condition,
    CrashLoopCondition,
    ErrorRateCondition,
    LeakCondition,
    OomCrashCondition,
    StallCondition,
    ThresholdCondition,
)
from controlplane.policy.detectors.findings import Finding
from controlplane.policy.detectors.leak import judge_leak
from controlplane.policy.evaluate import (
    GPU_CONDITIONS,
    actions_for,
    detect_gpu,
    detect_replica,
    evaluate_policy,
    in_scope_gpus,
    in_scope_keys,
    in_scope_replicas,
)
from controlplane.policy.memory import KeptReadings
from controlplane.policy.policy import Policy
from controlplane.policy.proposals import ProposedAction
from controlplane.policy.recheck import recheck
from controlplane.policy.screens import screen
from controlplane.policy.shards import Part, judged_by_nodes
from controlplane.policy.snapshot import FleetSnapshot, Gpu, Replica
from controlplane.policy.versions import Versions, gpu_mark, replica_mark

REPLICA_CONDITIONS = (ThresholdCondition, ErrorRateCondition, StallCondition, LeakCondition, CrashLoopCondition,
                      OomCrashCondition)


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


class _Answers:
    """One policy's answers on its subjects as of the round ``round``: those screened calm (a calm screen stays
    calm while the subject is unchanged and the clock moves on, ``screens``; a changed one is walked again), those
    judged quiet, those with a finding (judged again every round), and the quiet ones by the moment they fall
    due (a heap; an entry whose answer was replaced since is skipped when it comes up)."""

    __slots__ = ("at", "calm", "due", "found", "quiet", "round", "scoped", "unsettled")

    def __init__(self) -> None:
        self.round = -1
        self.at: datetime | None = None
        self.scoped: frozenset[str] | None = None  # the subjects in a selecting scope as of ``round``
        self.calm: set[str] = set()
        self.quiet: dict[str, _Quiet] = {}
        self.found: set[str] = set()
        self.unsettled: list[str] = []  # judged quiet by the last round: their ``until`` is still pending
        self.due: list[tuple[datetime, int, str, _Quiet]] = []


class Evaluator:
    """``evaluate`` across rounds, judging again only the subjects whose answer may have changed.

    A policy looked at in the round before is asked only of the subjects in its scope that are new objects since
    (a changed or new node's), those whose quiet answer fell due, those it found something on, those judged quiet
    last round (their moment is worked out now) and those that entered its scope: with a snapshot that keeps
    unchanged nodes' objects, a round walks what changed, not the fleet. A policy new to the evaluator (or
    skipped a round) is asked of every subject in scope, each answer reused where it still holds."""

    def __init__(self, whole_walk_share: float = 0.75) -> None:
        # By the policy object: a changed file loads new objects, whose answers are not known yet.
        self._answers: dict[int, tuple[Policy, _Answers]] = {}
        # Past this share of a policy's subjects to look at again, a round walks them all in order instead.
        self._whole_walk_share = whole_walk_share
        self._replicas = Versions()
        self._gpus = Versions()
        self._round = 0
        self._pushed = 0  # a tie-breaker for the due heaps
        # The governor's readings of replicas, kept while the snapshot hands over the same objects.
        self._readings = KeptReadings()
        # ``recheck``'s answers by the round they are for, shared by the policies (one subject, one window).
        self._moments: dict[datetime, dict[tuple[str, float], datetime | None]] = {}
        self.judged = 0  # subjects judged by the last round
        self.reused = 0  # known quiet from an earlier round
        self.screened = 0  # told quiet by their fields or newest reading (``screens``)
        self.walked = 0  # subject-policy pairs the last round looked at (the rest were left as they were)
        self.primed = False  # a round has judged every subject since this was made or cleared

    def clear(self) -> None:
        self.primed = False
        self._answers.clear()
        self._readings.clear()
        self._replicas = Versions()
        self._gpus = Versions()

    def evaluate(self, policies: Sequence[Policy], snapshot: FleetSnapshot, now: datetime,
                 part: Part | None = None) -> list[ProposedAction]:
        """What ``evaluate(policies, snapshot, now, part)`` returns, in the same order. The part may change
        between rounds (shards taken over or handed on): subjects new to it are judged afresh."""
        part = part or Part.whole()
        policies = part.policies(policies)
        models = part.models_view(snapshot)
        kept = {id(p): (p, known[1] if (known := self._answers.get(id(p))) and known[0] is p else _Answers())
                for p in policies}
        self._answers = kept
        self._round += 1
        self.judged = self.reused = self.screened = self.walked = 0
        self._replicas.update(models.replicas, lambda r: replica_mark(r, snapshot))
        self._gpus.update(snapshot.gpus if part.nodes else (), gpu_mark)
        self._moments.clear()
        out: list[ProposedAction] = []
        for policy in policies:
            cond = policy.condition
            if not policy.enabled:
                continue
            view = snapshot if judged_by_nodes(policy) else models
            if isinstance(policy.action, LowerMaxNumSeqsAction) or not isinstance(
                    cond, REPLICA_CONDITIONS + GPU_CONDITIONS):
                out += evaluate_policy(policy, view, now, self._readings)
                continue
            found = self._detect(policy, view, now, kept[id(policy)][1])
            out += actions_for(policy, found, view)
        self._readings.keep_only(models.replicas)
        self.primed = True
        return out

    def _settle(self, known: _Quiet) -> _Quiet:
        """``known`` with its ``until``: the first moment after its look that time alone could change it."""
        inputs = known.pending
        assert inputs is not None
        moments = self._moments.setdefault(known.at, {})
        until = recheck(inputs.cond, inputs.history, inputs.since, known.at, inputs.key, moments)
        due = inputs.leak_due
        if due is not None and (until is None or due < until):
            until = due
        return _Quiet(known.version, known.at, until)

    def _detect(self, policy: Policy, snapshot: FleetSnapshot, now: datetime, answers: _Answers) -> list[Finding]:
        cond = policy.condition
        gpus = isinstance(cond, GPU_CONDITIONS)
        versions = self._gpus if gpus else self._replicas
        scoped = in_scope_keys(policy, snapshot, gpus)
        walk_changed = answers.round == self._round - 1 and answers.at is not None and answers.at <= now
        keys = self._candidates(answers, versions, now) if walk_changed else set()
        if walk_changed and scoped is not None and answers.scoped is not None:
            # Entered or left the scope: a GPU follows the replicas on it, which need not have touched the GPU.
            keys |= scoped ^ answers.scoped
        judge = keys if scoped is None else keys & scoped
        # Most of the fleet to look at again (nearly every node reported since): walking it in order and starting
        # the answers afresh costs less than picking the keys out one by one (0.25 s of a round at 1,000 nodes).
        walk_changed = walk_changed and len(judge) <= len(
            versions.order if scoped is None else scoped) * self._whole_walk_share
        answers.scoped = scoped
        subjects: Sequence[Replica | Gpu]
        if walk_changed:
            order = versions.order
            subjects = [versions.subjects[k] for k in sorted((k for k in judge if k in order), key=order.__getitem__)]
            old_quiet = {key: answers.quiet.pop(key) for key in keys if key in answers.quiet}
            for key in keys:
                answers.calm.discard(key)
            answers.found.difference_update(keys)
        else:
            subjects = in_scope_gpus(policy, snapshot) if gpus else in_scope_replicas(policy, snapshot)
            old_quiet, answers.quiet = answers.quiet, {}  # every old answer is looked at again (or dropped)
            answers.calm, answers.found, answers.due = set(), set(), []
        calm = screen(cond, now)
        leaks = isinstance(cond, LeakCondition)
        prefix = "gpu:" if gpus else "replica:"
        found: list[Finding] = []
        unsettled: list[str] = []
        self.walked += len(subjects)
        for subject in subjects:
            key = subject.key
            if calm is not None and calm(subject):
                answers.calm.add(key)
                continue
            version = versions[key]
            known = old_quiet.get(key)
            if known is not None and known.version == version and known.at <= now:
                if known.pending is not None:
                    known = self._settle(known)
                    if walk_changed and known.until is not None:  # a whole walk builds its heap at the end
                        self._push(answers, known.until, key, known)
                if known.until is None or now < known.until:
                    answers.quiet[key] = known
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
                answers.found.add(key)
                continue
            answers.quiet[key] = _Quiet(version, now, None, _Inputs(cond, subject.history, since, prefix + key, due))
            unsettled.append(key)
        if not walk_changed:
            # Rebuilt whole: the heap holds the settled answers kept (the unsettled ones join it next round).
            answers.due = [(q.until, i, k, q) for i, (k, q) in enumerate(answers.quiet.items())
                           if q.pending is None and q.until is not None]
            heapify(answers.due)
        elif len(answers.due) > 2 * len(answers.quiet) + 1_024:
            live = [entry for entry in answers.due if answers.quiet.get(entry[2]) is entry[3]]
            heapify(live)
            answers.due = live  # replaced answers' entries, dropped before the heap outgrows the answers
        answers.unsettled = unsettled
        answers.round, answers.at = self._round, now
        self.screened += len(answers.calm)
        self.reused += len(answers.quiet) - len(unsettled)
        return found

    def _candidates(self, answers: _Answers, versions: Versions, now: datetime) -> set[str]:
        """The keys whose answer may differ from the last round's: new objects (or gone), findings, answers
        whose moment is still to be worked out, and answers that fell due."""
        keys = set(versions.changed)
        keys.update(answers.found)
        keys.update(answers.unsettled)
        due = answers.due
        while due and due[0][0] <= now:
            _, _, key, quiet = heappop(due)
            if answers.quiet.get(key) is quiet:
                keys.add(key)
        return keys

    def _push(self, answers: _Answers, until: datetime, key: str, quiet: _Quiet) -> None:
        self._pushed += 1
        heappush(answers.due, (until, self._pushed, key, quiet))
