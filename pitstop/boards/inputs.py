"""What the dashboards take from the rest of the repository: the SLO targets and the alert names.

The targets are read from the shipped remediation policies through the policy loader (``ttft-slo``,
``itl-slo``, ``error-rate``), so a changed threshold moves the panels' threshold lines at the next generation;
the alert names come from ``alerts/pitstop-rules.yml`` (the firing-alerts panels select Pitstop's alerts by
name, whatever labels their expressions keep).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from controlplane.policy.conditions import ErrorRateCondition, ThresholdCondition
from controlplane.policy.policy import Policy
from pitstop.share import folder

RULES = folder("alerts") / "pitstop-rules.yml"
TTFT_POLICY, ITL_POLICY, ERROR_POLICY = "ttft-slo", "itl-slo", "error-rate"


class InputError(ValueError):
    """A policy or rule file the dashboards cannot be generated from (names the file or the policy)."""


@dataclass(frozen=True)
class Slo:
    """One objective: a latency quantile under ``threshold`` seconds, or a ratio under ``threshold``."""

    policy: str
    threshold: float
    quantile: float | None = None  # 0.99 for a p99 objective; None for a ratio

    @property
    def budget(self) -> float:
        """The share of requests (or tokens) allowed to miss: 1 % for a p99 objective, the ratio itself else."""
        return round(1 - self.quantile, 6) if self.quantile is not None else self.threshold

    @property
    def percentile(self) -> str:
        return f"p{round((self.quantile or 0) * 100):d}"


@dataclass(frozen=True)
class Targets:
    ttft: Slo
    itl: Slo
    errors: Slo


@dataclass(frozen=True)
class Inputs:
    targets: Targets
    alerts: tuple[str, ...]  # every alert of alerts/pitstop-rules.yml, sorted


def _policy(policies: Sequence[Policy], name: str) -> Policy:
    for policy in policies:
        if policy.name == name:
            return policy
    raise InputError(f"no policy named {name!r} among the shipped policies: the SLO panels read it")


def _latency(policies: Sequence[Policy], name: str) -> Slo:
    condition = _policy(policies, name).condition
    if not isinstance(condition, ThresholdCondition):
        raise InputError(f"policy {name}: expected a threshold condition on a latency quantile")
    match = re.fullmatch(r"\w+_p(\d+)_seconds", condition.signal)
    if match is None:
        raise InputError(f"policy {name}: signal {condition.signal} is not a latency quantile (…_pNN_seconds)")
    return Slo(name, condition.threshold, int(match.group(1)) / 100)


def slo_targets(policies: Sequence[Policy]) -> Targets:
    """The TTFT, ITL and error-ratio objectives of the given policies."""
    errors = _policy(policies, ERROR_POLICY).condition
    if not isinstance(errors, ErrorRateCondition):
        raise InputError(f"policy {ERROR_POLICY}: expected the error_rate detector")
    return Targets(ttft=_latency(policies, TTFT_POLICY), itl=_latency(policies, ITL_POLICY),
                   errors=Slo(ERROR_POLICY, errors.threshold))


def alert_names(path: Path = RULES) -> tuple[str, ...]:
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    try:
        names = {rule["alert"] for group in data["groups"] for rule in group["rules"] if "alert" in rule}
    except (KeyError, TypeError) as exc:
        raise InputError(f"{path.name}: not a Prometheus rule file ({exc})") from exc
    if not names:
        raise InputError(f"{path.name}: no alert")
    return tuple(sorted(names))


def load(rules: Path = RULES) -> Inputs:
    """The shipped policies' objectives and the rule file's alerts."""
    from controlplane.policy.loader import PolicyLoadError
    from controlplane.policy_files import load_directory

    try:
        policies = load_directory()
    except PolicyLoadError as exc:
        raise InputError(f"the shipped policies do not load:\n{exc}") from exc
    return Inputs(targets=slo_targets(policies), alerts=alert_names(rules))
