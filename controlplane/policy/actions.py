"""What a policy does when its condition holds: an action kind plus its parameters."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, field_validator, model_validator

from controlplane.policy.conditions import ThresholdCondition
from controlplane.policy.durations import Duration
from controlplane.policy.engine_args import GOVERNED_FLAGS
from engines import ADAPTERS

Severity = Literal["info", "warning", "page"]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class RestartAction(_Action):
    """Drain (readiness off, in-flight work finishes) then restart the engine with the same arguments.

    The agent drains every restart, except of a WEDGED engine, which would finish nothing and is stopped at
    once. ``drain: false`` is refused at load rather than accepted and ignored.
    """

    kind: Literal["restart"]
    drain: Literal[True] = True


class RollingRestartAction(_Action):
    """Restart every replica of the target's model, ``batch_size`` at a time."""

    kind: Literal["rolling_restart"]
    batch_size: int = Field(default=1, ge=1)


class PlannedRestartAction(_Action):
    """A drained restart the executor may schedule any time within ``within`` (leaks: not urgent)."""

    kind: Literal["planned_restart"]
    within: Duration = Field(default=3600.0, gt=0)


class RaiseSpec(BaseModel):
    """Hysteresis for raising max-num-seqs again: the SLO met with margin for longer than it took to lower."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    # Raise only while the signal stays below threshold * margin ...
    margin: float = Field(default=0.7, gt=0, lt=1)
    # ... for this long, at the current value.
    for_: Duration = Field(default=900.0, alias="for", gt=0)
    max: int = Field(default=256, ge=1)
    # A value that broke the SLO within this long is not tried again: the fleet settles below it.
    remember: Duration = Field(default=3600.0, gt=0)


class FlagRung(BaseModel):
    """A rung of the ladder after max-num-seqs: an engine flag the governor adds, one canary at a time.

    ``value`` None is a switch (``--disable-custom-all-reduce``). ``multi_gpu``: only replicas that run over
    more than one GPU take it (several GPUs assigned, or tensor/pipeline parallel > 1). ``min_gain``: the
    canary must cut the governed latency p99 by this share against its baseline, or it is rolled back (a
    flag that does not help is a restart for nothing). ``retry_after``: a rung rolled back on a model is not
    tried there again for this long.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    flag: str = Field(pattern=r"^--[a-z0-9][a-z0-9-]*$")
    value: int | str | None = None
    multi_gpu: bool = False
    min_gain: float = Field(default=0.05, ge=0, lt=1)
    retry_after: Duration = Field(default=6 * 3600.0, gt=0)

    @property
    def text(self) -> str | None:
        """The value as it goes on the command line (None for a switch)."""
        return None if self.value is None else str(self.value)

    @property
    def label(self) -> str:
        return self.flag if self.value is None else f"{self.flag} {self.value}"

    @model_validator(mode="after")
    def _sane(self) -> FlagRung:
        if self.flag in GOVERNED_FLAGS:
            raise ValueError(f"{self.flag} is the governor's own lever (ladder/min), not a rung of then")
        if self.text is not None and (not self.text or self.text.startswith("-")):
            raise ValueError(f"value {self.text!r} for {self.flag} is empty or looks like another flag")
        if self.flag in SWITCHES and self.value is not None:
            raise ValueError(f"{self.flag} is a switch: it takes no value")
        if self.flag in VALUED and self.value is None:
            raise ValueError(f"{self.flag} needs a value")
        if self.flag in MULTI_GPU_ONLY and not self.multi_gpu:
            raise ValueError(f"{self.flag} changes nothing on a one-GPU engine: set multi_gpu: true")
        return self


# The engines' flags a rung is checked against (each adapter's ``rungs``; others are taken as written). A rung
# one engine knows and the replica's does not is skipped on that replica (``rungs.next_rung``).
SWITCHES = frozenset(f for a in ADAPTERS.values() for f in a.rungs.switches)
VALUED = frozenset(f for a in ADAPTERS.values() for f in a.rungs.valued)
MULTI_GPU_ONLY = frozenset(f for a in ADAPTERS.values() for f in a.rungs.multi_gpu_only)


class LowerMaxNumSeqsAction(_Action):
    """The max-num-seqs governor: lower under pressure (canary on one replica first), raise when it is gone.

    vLLM fixes --max-num-seqs at start, so every change is a restart with new engine arguments.
    """

    kind: Literal["lower_max_num_seqs"]
    factor: float = Field(default=0.5, gt=0, lt=1)
    min: int = Field(default=8, ge=1)
    # Explicit values to step through instead of multiplying by factor (any order; sorted when used).
    ladder: list[int] | None = Field(default=None, min_length=1)
    # ``ladder``: one rung (or factor) down per breach. ``proportional``: jump to the largest value the
    # measured latency and running batch predict will meet threshold * headroom (see governor.py).
    step: Literal["ladder", "proportional"] = "ladder"
    headroom: float = Field(default=0.8, gt=0, le=1)
    # Lowering trades throughput for latency: a lowered replica whose throughput fell more than this below
    # its peers' is not lowered further (an alert instead), and a canary is judged against it.
    max_throughput_drop: float | None = Field(default=None, gt=0, lt=1)
    canary: bool = True
    # What the engine runs when its arguments carry no --max-num-seqs (vLLM's default depends on the GPU).
    assumed_default: int = Field(default=256, ge=1)
    raise_: RaiseSpec | None = Field(default=None, alias="raise")
    # The next rungs once max-num-seqs cannot go lower (its floor, or the throughput limit) and the SLO still
    # breaches: engine flags added in order, each as a canary judged against its baseline.
    then: list[FlagRung] = Field(default_factory=list)
    # Other pressures that lower max-num-seqs (one rung at a time), e.g. preemptions: a smaller batch needs
    # less KV cache. Raising waits for each to be comfortable too (under its threshold x raise.margin).
    pressure: list[ThresholdCondition] = Field(default_factory=list)

    @model_validator(mode="after")
    def _ladder_positive(self) -> LowerMaxNumSeqsAction:
        if self.ladder is not None and any(v < 1 for v in self.ladder):
            raise ValueError("ladder values must be positive integers")
        return self

    @field_validator("pressure")
    @classmethod
    def _pressure_is_an_upper_bound(cls, conds: list[ThresholdCondition]) -> list[ThresholdCondition]:
        for cond in conds:
            if cond.op not in (">", ">="):
                raise ValueError(f"a pressure condition lowers max-num-seqs when {cond.signal} is too high: "
                                 f"use op '>' or '>=' (got {cond.op!r})")
        return conds

    @field_validator("then")
    @classmethod
    def _one_rung_per_flag(cls, rungs: list[FlagRung]) -> list[FlagRung]:
        flags = [r.flag for r in rungs]
        repeated = sorted({f for f in flags if flags.count(f) > 1})
        if repeated:
            raise ValueError(f"{', '.join(repeated)} appears more than once: one rung per flag")
        return rungs


class CordonAction(_Action):
    """Stop placing replicas on the GPU's node; running replicas keep serving until moved."""

    kind: Literal["cordon"]
    scope: Literal["node", "gpu"] = "node"


class AlertAction(_Action):
    kind: Literal["alert"]
    severity: Severity = "warning"


Action = Annotated[
    RestartAction | RollingRestartAction | PlannedRestartAction | LowerMaxNumSeqsAction | CordonAction | AlertAction,
    Discriminator("kind"),
]
