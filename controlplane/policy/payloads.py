"""The action contract: one pydantic model per action kind, joined in a discriminated union on ``kind``.

A payload is what an action asks for (the proposer's part: the new engine arguments, the batch size, the GPU
to fence) and what the executor has recorded of it so far (its part: the generations it applied, what a
restart captured, a rollout's progress). Policies and the operator API build these models; the store keeps
``payload_json`` in ``ActionRow.params``; ``read_payload`` validates a stored row on its way back, so a row
that no longer fits its kind is found and reported, never half-read. Nothing else reads a payload by key.

The JSON form omits ``kind`` (the row and the API carry it beside the payload) and fields left unset, except
the few where null means something (``NULLABLE``: a switch's ``value``, a stack dump that never came).
See docs/design.md, "The action contract".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal, cast, get_args

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    ValidationError,
    model_serializer,
)

from controlplane.policy.engine_args import (
    MAX_NUM_SEQS,
    get_flag,
    get_int_flag,
    governed_limit,
    has_flag,
    set_flag,
    spans_gpus,
    with_flag,
)
from engines import EngineAdapter

Severity = Literal["info", "warning", "page"]
# The engines' governed flags (``engines/``: each adapter's ``governed_flag``).
GovernedFlag = Literal["--max-num-seqs", "--max-running-requests"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Fields whose null is a value, kept in the JSON form (every other unset field is left out).
    NULLABLE: ClassVar[frozenset[str]] = frozenset()

    # No return annotation on purpose: pydantic then documents the model's own fields in the API schema.
    @model_serializer(mode="wrap")
    def _leave_out_unset(self, handler: SerializerFunctionWrapHandler):  # type: ignore[no-untyped-def]
        data = handler(self)
        return {k: v for k, v in data.items() if v is not None or k in self.NULLABLE}


class Captured(_Model):
    """What a restart kept of the engine it replaced: the last log lines and, when the agent sends it, a stack
    dump (py-spy) taken before the drain."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"stack_dump", "state"})

    log_tail: list[str] = Field(default_factory=list)
    state: str | None = None
    stack_dump: str | None = None
    stack_dump_note: str = ""


class Judge(_Model):
    """What a canary is judged on: the governed latencies, the throughput a change may cost, the gain a flag
    rung must show, and against what (``same_args``: peers tuned as the canary was before its change)."""

    latencies: list[str] = Field(default_factory=list)
    max_throughput_drop: float | None = Field(default=None, gt=0, lt=1)
    min_latency_gain: float | None = Field(default=None, ge=0, lt=1)
    baseline: Literal["peers", "same_args"] | None = None


class CanaryVerdictRecord(_Model):
    verdict: Literal["pass", "fail", "wait"]
    reason: str
    figures: dict[str, float | None] = Field(default_factory=dict)


class RolloutPlan(_Model):
    """A rollout's whole progress, kept in its action so any leader carries on from the batch it was in.

    ``phase``: ``canary`` (one replica converging, then judged beside its peers), ``rolling`` (the queue of
    batches, one at a time within the disruption budget) or ``rolled_back``. ``batch``: the replicas of the
    batch in flight and the generation each must reach.
    """

    phase: Literal["canary", "rolling", "rolled_back"]
    queue: list[list[str]] = Field(default_factory=list)
    done: list[str] = Field(default_factory=list)
    batch: dict[str, int] = Field(default_factory=dict)
    batch_started_at: AwareDatetime | None = None
    # When the batch was first seen READY at its new generation: it is done ``settle`` later.
    batch_ready_at: AwareDatetime | None = None
    waiting: str | None = None
    canary: str | None = None
    previous_args: list[str] | None = None
    canary_ready_at: AwareDatetime | None = None
    # When the canary's window ends and it is judged (its READY plus canary_window_seconds): what the console
    # counts down to. Absent in plans recorded before it was kept.
    canary_judged_at: AwareDatetime | None = None
    canary_verdict: CanaryVerdictRecord | None = None
    # The replicas the canary was judged against, or "itself before the change".
    baseline: list[str] | str | None = None


class _Payload(_Model):
    runbook_url: str | None = None


class Applied(_Payload):
    """A change written to replicas' desired state: the generation each must reach (None: a drain, stopped)."""

    applied: dict[str, int | None] | None = None


class _Restarts(Applied):
    captured: dict[str, Captured] | None = None


class RestartPayload(_Restarts):
    """Restart the replica with the arguments it runs (the agent drains it first; a WEDGED engine, which would
    finish nothing, it stops at once). The stall policy's restart captures the engine's stacks first."""

    kind: Literal["restart"] = Field("restart", exclude=True)


class PlannedRestartPayload(_Restarts):
    """A drained restart the executor starts at ``not_before``, the quietest moment it forecast before the
    ``deadline`` (a leak: not urgent); ``within_seconds`` is the policy's bound."""

    kind: Literal["planned_restart"] = Field("planned_restart", exclude=True)
    within_seconds: float = Field(default=3600.0, gt=0)
    not_before: AwareDatetime | None = None
    deadline: AwareDatetime | None = None
    schedule: str | None = None


class DrainPayload(Applied):
    """Drain the replica and keep it stopped (its desired state disabled)."""

    kind: Literal["drain"] = Field("drain", exclude=True)


class RollingRestartPayload(_Payload):
    """Restart every managed replica of a model, ``batch_size`` at a time, within its disruption budget."""

    kind: Literal["rolling_restart"] = Field("rolling_restart", exclude=True)
    batch_size: int = Field(default=1, ge=1)
    rollout: RolloutPlan | None = None


class _NewArgs(Applied):
    """A change of engine arguments: vLLM reads them at start, so each replica restarts into a new generation.

    ``engine_args`` lists the arguments per replica (``node/replica``) as the proposer derived them; a peer it
    did not list (a canary's value rolled to the rest of the model) gets ``derive`` of its own arguments.
    """

    engine_args: dict[str, list[str]] = Field(default_factory=dict)
    canary: bool = False
    judge: Judge | None = None
    rollout: RolloutPlan | None = None

    def derive(self, args: Sequence[str]) -> list[str]:
        """``args`` with this change made: the one derivation of new engine arguments."""
        raise NotImplementedError

    def args_for(self, key: str, current: Sequence[str]) -> list[str]:
        """The arguments ``key`` restarts with: as listed, else its ``current`` ones with the change."""
        listed = self.engine_args.get(key)
        return list(listed) if listed is not None else self.derive(current)

    def needs(self, args: Sequence[str], gpus: Sequence[int]) -> bool:
        """Whether an engine with ``args`` on ``gpus`` still lacks this change (and takes it)."""
        raise NotImplementedError

    @property
    def change(self) -> str:
        """The change in words, for outcomes."""
        raise NotImplementedError


class SetFlagsPayload(_NewArgs):
    """An operator's full argument list for one replica."""

    kind: Literal["set_flags"] = Field("set_flags", exclude=True)

    def derive(self, args: Sequence[str]) -> list[str]:
        return list(args)  # nothing to derive: an operator names every argument

    def needs(self, args: Sequence[str], gpus: Sequence[int]) -> bool:
        return False

    @property
    def change(self) -> str:
        return "the operator's engine arguments"


def governed_flag(engine: EngineAdapter) -> GovernedFlag | None:
    """``MaxNumSeqsPayload.flag`` for a change of ``engine``'s running limit: None for the default engine's."""
    flag = engine.governed_flag
    if flag == MAX_NUM_SEQS:
        return None
    if flag not in get_args(GovernedFlag):
        raise ValueError(f"{engine.title}'s governed flag {flag} is not among GovernedFlag's")
    return cast(GovernedFlag, flag)


class MaxNumSeqsPayload(_NewArgs):
    """The governor's change of the engine's running limit, lower or raise, on one replica (a canary) or several.

    ``flag`` is the model's engine's governed flag (``engines/``) where it is not the default engine's:
    ``--max-running-requests`` for SGLang; None (left out of the stored form, as in every action stored before
    engines had names) for vLLM's ``--max-num-seqs``."""

    kind: Literal["lower_max_num_seqs", "raise_max_num_seqs"] = Field(exclude=True)
    max_num_seqs: int = Field(ge=1)
    previous: int = Field(ge=1)
    flag: GovernedFlag | None = None

    @property
    def governed(self) -> str:
        """The flag the change sets."""
        return self.flag or MAX_NUM_SEQS

    def derive(self, args: Sequence[str]) -> list[str]:
        return set_flag(args, self.governed, str(self.max_num_seqs))

    def needs(self, args: Sequence[str], gpus: Sequence[int]) -> bool:
        return get_int_flag(args, self.governed) != self.max_num_seqs

    @property
    def change(self) -> str:
        return f"{self.governed} {self.max_num_seqs}"


class AddEngineFlagPayload(_NewArgs):
    """A flag rung: add ``flag`` (a switch when ``value`` is None) as a canary, judged against its baseline."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"value"})

    kind: Literal["add_engine_flag"] = Field("add_engine_flag", exclude=True)
    flag: str = Field(pattern=r"^--[a-z0-9][a-z0-9-]*$")
    value: str | None = None
    rung: int = Field(ge=1)
    multi_gpu: bool = False
    # The canary's max-num-seqs when the rung was proposed (its baseline peers run the same).
    max_num_seqs: int = Field(ge=1)

    def derive(self, args: Sequence[str]) -> list[str]:
        return with_flag(args, self.flag, self.value)

    def takes(self, args: Sequence[str], gpus: Sequence[int]) -> bool:
        """Whether an engine takes this rung at all (a multi-GPU rung skips one-GPU engines)."""
        return not self.multi_gpu or spans_gpus(args, gpus)

    def needs(self, args: Sequence[str], gpus: Sequence[int]) -> bool:
        return self.takes(args, gpus) and not has_flag(args, self.flag, self.value)

    def tuning(self, args: Sequence[str]) -> tuple[int | None, str | None, bool]:
        """What a like-for-like baseline must share with the canary before its change."""
        return governed_limit(args), get_flag(args, self.flag), self.flag in args

    @property
    def change(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"


class SetLiveCapPayload(Applied):
    """Cap the requests a replica's engine runs at once, live, through its live-cap plug-in (``live_limits:
    true``): no restart and no drain, the engine takes it at its next scheduler step. ``live_cap`` None lifts
    the cap (the engine's startup ``--max-num-seqs`` again); ``previous`` is the cap the first replica had
    (None: none), which a canary that fails gets back. ``applied`` keeps each replica's generation when it was
    written: a restart since does not undo the cap (the agent writes it for the new engine too), and the change
    is judged on the agent's report of it. The governor's live step is a canary (``canary``, ``judge``) rolled
    to the model's other replicas as its restarts are (``rollout``)."""

    NULLABLE: ClassVar[frozenset[str]] = frozenset({"live_cap"})  # required, and null lifts the cap

    kind: Literal["set_live_cap"] = Field("set_live_cap", exclude=True)
    live_cap: int | None = Field(ge=1, le=65536)
    previous: int | None = Field(default=None, ge=1, le=65536)
    canary: bool = False
    judge: Judge | None = None
    rollout: RolloutPlan | None = None

    def needs(self, asked: int | None) -> bool:
        """Whether an engine whose agent last wrote ``asked`` still lacks this cap."""
        return asked != self.live_cap


class CordonPayload(_Payload):
    """Fence a node, or with ``scope: gpu`` one GPU of it (only the replicas using it drain), or give it back."""

    kind: Literal["cordon", "uncordon"] = Field(exclude=True)
    scope: Literal["node", "gpu"] = "node"
    gpu: int | None = Field(default=None, ge=0, le=1023)


class AlertPayload(_Payload):
    """Raise an alert. ``governed``: the governor's "nothing left to try", held while a change of the model
    is still being judged (it may yet help)."""

    kind: Literal["alert"] = Field("alert", exclude=True)
    severity: Severity = "warning"
    governed: bool | None = None


Payload = Annotated[
    RestartPayload | PlannedRestartPayload | DrainPayload | RollingRestartPayload | SetFlagsPayload
    | MaxNumSeqsPayload | AddEngineFlagPayload | SetLiveCapPayload | CordonPayload | AlertPayload,
    Field(discriminator="kind"),
]
NewArgsPayload = SetFlagsPayload | MaxNumSeqsPayload | AddEngineFlagPayload
RestartsPayload = RestartPayload | PlannedRestartPayload
_ADAPTER: TypeAdapter[Payload] = TypeAdapter(Payload)


class CorruptPayload(ValueError):
    """A stored payload that does not validate as its kind: the action fails with this, the loop goes on."""


def payload_json(payload: BaseModel) -> dict[str, Any]:
    """The JSON form kept in the store and served by the API: no ``kind``, unset fields left out."""
    data: dict[str, Any] = payload.model_dump(mode="json")
    return data


def parse_payload(kind: str, data: Mapping[str, Any]) -> Payload:
    """Validate ``data`` (a payload's JSON form) as the payload of ``kind``; raises ``CorruptPayload``."""
    try:
        return _ADAPTER.validate_python({**data, "kind": kind})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'][1:]) or 'kind'}: {e['msg']}"
                             for e in exc.errors()[:5])
        raise CorruptPayload(f"stored {kind!r} payload does not validate: {problems}") from exc
