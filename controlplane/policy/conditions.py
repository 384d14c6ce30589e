"""Policy conditions: a named detector plus its parameters, never an expression language.

A condition without ``detector`` but with ``signal`` is a threshold condition, so the common case reads
``{signal: ttft_p99_seconds, op: ">", threshold: 0.5, for: 60s}``; one with ``alert`` is an Alertmanager alert
condition, ``{alert: TTFTHigh, for: 1m}``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Discriminator, Field, Tag

from controlplane.policy.durations import Duration
from controlplane.policy.signals import Signal

Op = Literal[">", ">=", "<", "<="]


class _Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @property
    def clear_after(self) -> float:
        """How long the condition must stay false before its alert resolves: its ``for:``, else at once (the
        detectors without one already look back over their own window)."""
        held = getattr(self, "for_", None)
        return float(held) if held is not None else 0.0


class ThresholdCondition(_Condition):
    """A signal on the other side of a threshold in every sample of the last ``for`` (or in ``min_share`` of
    them).

    ``min_share`` is for bursty per-scrape percentiles: with closed-loop traffic, prefill bursts make the
    agent's per-window ITL p99 jump above the threshold for a few seconds in every ten and sit far below it in
    between, so "every sample" never holds while the p99 over a minute is well over the threshold.
    """

    detector: Literal["threshold"] = "threshold"
    signal: Signal
    op: Op
    threshold: float
    for_: Duration = Field(alias="for", gt=0)
    min_share: float = Field(default=1.0, gt=0, le=1)


class ErrorRateCondition(_Condition):
    """Errors per request over the window above ``threshold`` (a ratio: 0.001 is 0.1 %)."""

    detector: Literal["error_rate"]
    threshold: float = Field(gt=0, le=1)
    for_: Duration = Field(alias="for", gt=0)
    # Below this traffic a single error is a large ratio and means nothing.
    min_requests_per_second: float = Field(default=0.5, ge=0)


class StallCondition(_Condition):
    """Work queued while generation_tokens_total does not move, confirmed by a failed canary."""

    detector: Literal["stall"]
    for_: Duration = Field(default=120.0, alias="for", gt=0)
    require_canary_failure: bool = True
    # running >= busy_ratio * max-num-seqs with tokens moving is a full batch, not a wedge (ray#54070).
    busy_ratio: float = Field(default=0.9, gt=0, le=1)


class LeakCondition(_Condition):
    """A steady memory climb (Theil-Sen slope) that reaches the limit within ``horizon``."""

    detector: Literal["leak"]
    resource: Literal["rss", "gpu_memory"]
    min_window: Duration = Field(default=600.0, gt=0)
    lookback: Duration = Field(default=7200.0, gt=0)
    min_samples: int = Field(default=20, ge=3)
    min_slope_bytes_per_minute: float = Field(default=4 * 2**20, gt=0)
    # Share of pairwise slopes that must be positive: flat noise sits near one half.
    min_rising_fraction: float = Field(default=0.65, gt=0.5, le=1)
    horizon: Duration = Field(default=86400.0, gt=0)
    # The limit: this many bytes, else the host's memory (rss) or the replica's GPUs' memory (gpu_memory).
    limit_bytes: int | None = Field(default=None, gt=0)
    limit_ratio: float = Field(default=0.95, gt=0, le=1)


class ThermalCondition(_Condition):
    """GPU temperature within ``margin_celsius`` of the device's own slowdown threshold, sustained."""

    detector: Literal["thermal"]
    margin_celsius: float = Field(default=5.0, ge=0)
    # Used when the device reports no slowdown threshold: the practitioners' 85 degC operating limit.
    default_limit_celsius: float = 85.0
    for_: Duration = Field(default=120.0, alias="for", gt=0)
    # Any active throttle reason containing one of these also counts (NVML clock-event reasons).
    throttle_reasons: list[str] = Field(default_factory=lambda: ["thermal"])


class XidCondition(_Condition):
    """New XID events on a GPU within ``within``, of the given blast radius."""

    detector: Literal["xid"]
    blast_radius: Literal["application", "hardware", "unknown", "any"] = "any"
    within: Duration = Field(default=900.0, gt=0)


class EccCondition(_Condition):
    """Uncorrected ECC errors on a GPU: its volatile counter rose by ``min_increase`` or more within ``within``
    (a counter that went down was reset by a GPU reset or a driver reload, and counts again from zero)."""

    detector: Literal["ecc"]
    within: Duration = Field(default=900.0, gt=0)
    min_increase: int = Field(default=1, ge=1)


class CrashLoopCondition(_Condition):
    """The supervisor gave up on a replica (FATAL after its start retries)."""

    detector: Literal["crash_loop"]


class OomCrashCondition(_Condition):
    """The engine's last exit came with CUDA out-of-memory in its log tail."""

    detector: Literal["oom_crash"]
    patterns: list[str] = Field(default_factory=lambda: ["CUDA out of memory", "OutOfMemoryError"])


class NodeUnreachableCondition(_Condition):
    """A node the control plane has heard nothing from for ``for``: its agent, its host or the link to it is down,
    and what runs there is unaccounted for. Counted on the control plane's clock, from the later of the node's
    last report and the moment this control plane began to hear reports (after its own outage, no node is
    judged dark before it had the time to report). Clears as soon as the node reports again."""

    detector: Literal["node_unreachable"]
    for_: Duration = Field(default=60.0, alias="for", gt=0)

    @property
    def clear_after(self) -> float:
        return 0.0  # a report is proof of life: the page resolves with it, not a for: later


class AlertCondition(_Condition):
    """An alert named ``alertname`` that Alertmanager posted (``POST /v1/alertmanager``) has fired on the
    subject for at least ``for``: a team's own Prometheus rules, with Pitstop's guarded actions.

    The subject is what the alert's labels mapped to when it was received: a replica, a node or a model.
    Without ``for`` it holds as soon as the alert fires (the Prometheus rule has usually waited its own).
    """

    detector: Literal["alert"] = "alert"
    alertname: str = Field(min_length=1, validation_alias=AliasChoices("alertname", "alert"))
    for_: Duration | None = Field(default=None, alias="for", ge=0)


# The union tag of AlertCondition. Not "alert": pydantic puts the tag in error locations, and the loader would
# read a tag equal to the shorthand's key (``alert: TTFTHigh``) as that key and point at the wrong field.
_ALERT_TAG = "alertmanager_alert"


def _condition_tag(value: Any) -> str:
    if isinstance(value, dict):
        shorthand = "alert" if "alert" in value else "missing"
        tag = str(value.get("detector", "threshold" if "signal" in value else shorthand))
    else:
        tag = str(getattr(value, "detector", "missing"))
    return _ALERT_TAG if tag == "alert" else tag


Condition = Annotated[
    Annotated[ThresholdCondition, Tag("threshold")]
    | Annotated[ErrorRateCondition, Tag("error_rate")]
    | Annotated[StallCondition, Tag("stall")]
    | Annotated[LeakCondition, Tag("leak")]
    | Annotated[ThermalCondition, Tag("thermal")]
    | Annotated[XidCondition, Tag("xid")]
    | Annotated[EccCondition, Tag("ecc")]
    | Annotated[CrashLoopCondition, Tag("crash_loop")]
    | Annotated[OomCrashCondition, Tag("oom_crash")]
    | Annotated[NodeUnreachableCondition, Tag("node_unreachable")]
    | Annotated[AlertCondition, Tag(_ALERT_TAG)],
    Discriminator(
        _condition_tag,
        custom_error_type="unknown_detector",
        custom_error_message="unknown detector: use signal/op/threshold, alert: ALERTNAME, or detector "
        "error_rate, stall, leak, thermal, xid, ecc, crash_loop, oom_crash, node_unreachable or alert",
    ),
]
