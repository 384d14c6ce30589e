"""Control-plane settings: defaults, then a YAML file, then ``PITSTOP_SERVER_*`` environment variables.

Every setting has a sane default so ``pitstop server`` runs with no file at all. Errors name the file and the
field, because the person reading them is an operator editing YAML at 3 a.m.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    SecretStr,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from agent.wire import DEFAULT_MAX_CLOCK_SKEW_SECONDS
from controlplane.notify.config import NotifierConfig, external_url_problem
from controlplane.notify.validation import EnvName, ExternalUrl
from controlplane.policy.loader import locate
from controlplane.security.roles import Role, person_name_problem

if TYPE_CHECKING:
    from controlplane.policy.guardrails import GuardConfig

ENV_PREFIX = "PITSTOP_SERVER_"
DEFAULT_DATABASE_URL = "sqlite:///.pitstop/pitstop.db"


class ConfigError(ValueError):
    """A configuration file or variable that cannot be used; the message names where and what."""


class ConfiguredToken(BaseModel):
    """A static token written as a mapping, for what a bare secret cannot say: ``on_behalf_of``.

    The secret is inline (``token``) or in an environment variable (``token_env``, read when the app starts), so
    a delegating token can stay out of the YAML file like every other secret. ``on_behalf_of: true`` lets the
    token act for the person a trusted proxy names (``X-Pitstop-On-Behalf-Of``), at that person's role
    (``people``) and never above its own: the console's service token behind a reverse proxy.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    token: SecretStr | None = None
    token_env: EnvName | None = None
    on_behalf_of: bool = False

    @model_validator(mode="after")
    def _one_form(self) -> ConfiguredToken:
        if (self.token is None) == (self.token_env is None):
            raise ValueError("give the secret as token (inline) or token_env (an environment variable), one of them")
        if self.token is not None and not self.token.get_secret_value().strip():
            raise ValueError("empty token")
        return self

    def secret(self, env: Mapping[str, str]) -> str:
        """The token's secret; ConfigError when ``token_env`` names a variable that is unset or empty."""
        if self.token is not None:
            return self.token.get_secret_value()
        value = env.get(self.token_env or "", "").strip()
        if not value:
            raise ConfigError(f"token_env {self.token_env}: that environment variable is not set (or empty)")
        return value


# The tags pydantic puts in an error's location inside a token list; errors leave them out (they are not keys).
_SECRET_TAG, _MAPPING_TAG = "<secret>", "<mapping>"


def _entry_form(value: Any) -> str:
    return _MAPPING_TAG if isinstance(value, dict | ConfiguredToken) else _SECRET_TAG


# A token of a person's role (viewer, operator, admin): the bare secret, or a mapping that says more. Agent and
# Alertmanager tokens stay bare secrets: they never act on behalf of anyone.
TokenEntry = Annotated[Annotated[SecretStr, Tag(_SECRET_TAG)] | Annotated[ConfiguredToken, Tag(_MAPPING_TAG)],
                       Discriminator(_entry_form)]


# A person is never an agent or an Alertmanager (``security.roles.PERSON_ROLES``).
PersonRole = Literal["viewer", "operator", "admin"]


class People(BaseModel):
    """Who a trusted proxy may name through a token with ``on_behalf_of``, and the role each acts with.

    A name in ``roles`` gets its role there (matched exactly: the proxy's spelling), anyone else
    ``default_role``; either way never more than the token's own role. Default: everyone named is a viewer, so
    granting a person the right to act is always written down here.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_role: PersonRole = "viewer"
    roles: dict[str, PersonRole] = Field(default_factory=dict)

    @field_validator("roles")
    @classmethod
    def _names_valid(cls, value: dict[str, PersonRole]) -> dict[str, PersonRole]:
        for name in value:
            problem = person_name_problem(name)
            if problem is not None:
                raise ValueError(f"the name {name!r} {problem}")
        return value

    def role_of(self, name: str) -> Role:
        return Role(self.roles.get(name, self.default_role))


class ServerConfig(BaseModel):
    """Everything ``create_app`` and ``pitstop server`` need to know."""

    # Inputs stay out of error messages: a mistyped key may hold a secret.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    # sqlite:///relative/path.db, sqlite:////absolute/path.db, or postgresql+psycopg://user@host/db
    database_url: str = DEFAULT_DATABASE_URL
    # Reports must carry ``Authorization: Bearer <one of these>`` when the list is not empty.
    agent_tokens: list[SecretStr] = Field(default_factory=list)
    # Read endpoints need one of these (operator tokens also read) when either list is not empty. An entry is
    # the secret, or a mapping {token | token_env, on_behalf_of} (``ConfiguredToken``).
    operator_tokens: list[TokenEntry] = Field(default_factory=list)
    viewer_tokens: list[TokenEntry] = Field(default_factory=list)
    # Manage tokens (and, later, policies); also operate and read.
    admin_tokens: list[TokenEntry] = Field(default_factory=list)
    # Alertmanager's webhook (``POST /v1/alertmanager``) must carry one of these; they may do nothing else.
    alertmanager_tokens: list[SecretStr] = Field(default_factory=list)
    # The roles of the people a token with ``on_behalf_of`` may act for (``People``).
    people: People = Field(default_factory=People)
    # Serve HTTPS with this certificate chain and key (PEM). Both or neither.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # Leadership: followers try to take the lock this often, so a dead leader is replaced within it.
    leader_poll_seconds: float = Field(default=2.0, gt=0)
    # The leader applies approved actions and reconciles running ones this often.
    executor_interval_seconds: float = Field(default=2.0, gt=0)
    # The leader queues due alert groups and sends the outbox this often.
    notify_interval_seconds: float = Field(default=1.0, gt=0)
    # Where the runbooks are published (notifications link a policy's relative runbook_url under it).
    runbook_base_url: str | None = None
    # A running action whose replica is not READY at the desired generation by then has failed.
    action_deadline_seconds: float = Field(default=600.0, gt=0)
    # A proposal nobody approved or rejected for this long expires: its evidence is stale by then, and an
    # approval would act on a fleet that has moved on.
    proposal_ttl_seconds: float = Field(default=86400.0, gt=0)
    # Policy files for the evaluation job: the built-in defaults (unless ``policy_defaults`` is false), then
    # every file of ``policy_dir`` and ``policy_dirs``; a policy named like an earlier one replaces it.
    policy_dir: str | None = None
    policy_dirs: list[str] = Field(default_factory=list)
    policy_defaults: bool = True
    # False turns the policy job off (the executor still applies operators' actions).
    policies_enabled: bool = True
    # The leader evaluates the policies this often, and also this long after a report (debounced).
    policy_interval_seconds: float = Field(default=5.0, gt=0)
    # A quarter second gathers the reports of a burst into one round and costs little of fault-to-action time;
    # on a large fleet the duty cap (below), not the debounce, paces the rounds. In the policy process, reports
    # that came during a round at least this long start the next one at once (they have waited already).
    policy_debounce_seconds: float = Field(default=0.25, ge=0)
    # After a round slower than half a second, the next waits so rounds take at most this share of the time.
    # 1 (no wait) by default: the rounds run in a process of their own, so they never hold the API's interpreter
    # (at 1,000 nodes report p99 was the same at 1 and 0.5), and a round judges what changed since
    # the one before (docs/design.md, "Rounds at fleet scale"): spaced further apart, each judges more, and at
    # 0.5 they came every 9 s instead of every 4.6 s. Lower it when the rounds share the API process
    # (``policy_process: false``).
    policy_max_duty: float = Field(default=1.0, gt=0, le=1)
    # ``pitstop server`` runs the policy rounds in a process of their own, so a large fleet's evaluation never
    # shares the API process's interpreter lock with reports; false runs them in the API process.
    policy_process: bool = True
    # The policy process's niceness (0 to 19). 0 by default: niced, the rounds yielded to every other process on a
    # busy host and fault to action waited on them, while report latency did not depend on it (docs/design.md,
    # "Rounds at fleet scale", Niceness). Raise it where the host's other work must come first.
    policy_process_nice: int = Field(default=0, ge=0, le=19)
    # Rounds spread by model over the control planes (docs/design.md, "Spreading rounds"): the number of model
    # shards, beside one node shard. 1: the leader judges the whole fleet. More, on PostgreSQL: every control
    # plane judges a fair share of the shards, each held as an advisory lock (SQLite: the leader holds them all).
    policy_shards: int = Field(default=1, ge=1, le=256)
    # How much sample history a policy pass reads.
    policy_history_seconds: float = Field(default=900.0, gt=0)
    # A follower keeps that history current (a warm standby: taking the lead then reads seconds of samples, not
    # the whole window, which took a 1,000-node fleet's new leader over a minute); false saves its memory.
    policy_warm_standby: bool = True
    # Fleet-wide guardrails (budgets, rate limit, breaker): ``controlplane.policy.guardrails.GuardConfig``.
    guardrails: dict[str, Any] = Field(default_factory=dict)
    # Canaries: the longest a canary runs beside its peers (the evidence usually decides sooner), how much worse
    # it may be, and the chance of a wrong verdict over a whole window (docs/design.md, "Canary evidence").
    canary_window_seconds: float = Field(default=120.0, gt=0)
    canary_alpha: float = Field(default=0.05, gt=0, lt=1)
    # A rollout's batch, READY at its new generation, is done this long after the control plane saw it so; only
    # then does the next batch leave rotation. At least the load balancer's time to put a replica back (HAProxy:
    # ``inter`` times ``rise``, 4 s with its defaults).
    rollout_settle_seconds: float = Field(default=5.0, ge=0)
    canary_max_latency_regression: float = Field(default=0.10, ge=0)
    canary_max_throughput_drop: float = Field(default=0.25, ge=0, le=1)
    # A node whose last report is older than this reads as ``stale``.
    stale_after_seconds: float = Field(default=30.0, gt=0)
    # Samples at full resolution for this long, then one-minute averages until ``sample_retention_seconds``.
    sample_full_resolution_seconds: float = Field(default=3600.0, gt=0)
    sample_retention_seconds: float = Field(default=7 * 86400.0, gt=0)
    retention_interval_seconds: float = Field(default=300.0, gt=0)
    # A report whose ``sent_at`` is further than this from the control plane's clock, or that holds a timestamp
    # later than the control plane's clock plus this, is refused (422): a clock far ahead would be remembered as
    # the node's last ``sent_at`` and hide its next agent restart, and its samples would be filed in the future.
    max_clock_skew_seconds: float = Field(default=DEFAULT_MAX_CLOCK_SKEW_SECONDS, gt=0)
    # Reports larger than this are refused with 413 before they are parsed.
    max_report_bytes: int = Field(default=1024 * 1024, gt=0)
    # Reports waiting for the database, at most (ten seconds of a 1,000-node fleet): past it a report gets a
    # 503 with Retry-After and the agent retries, rather than the backlog growing without bound in memory.
    max_pending_reports: int = Field(default=2000, gt=0)
    # How long a report waits for its write before the agent gets a 503 (the write may still land; the
    # agent's retry is then acknowledged as a duplicate).
    report_write_timeout_seconds: float = Field(default=30.0, gt=0)
    # Tells agents how often to report; None leaves it to the agent's own setting.
    report_interval_seconds: float | None = Field(default=None, gt=0)
    events_limit: int = Field(default=200, gt=0, le=10_000)
    # The console's base URL as on-call reaches it: notifications link to actions and runbooks under it.
    external_url: ExternalUrl | None = None
    # Receivers and the route tree of on-call notifications (controlplane/notify/config.py); empty: none sent.
    notifier: NotifierConfig = Field(default_factory=NotifierConfig)

    @field_validator("database_url")
    @classmethod
    def _known_backend(cls, value: str) -> str:
        if not (value.startswith("sqlite") or value.startswith("postgresql")):
            raise ValueError("must start with sqlite:// or postgresql+psycopg://")
        return value

    @model_validator(mode="after")
    def _tls_pair(self) -> ServerConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ValueError("tls_cert_file and tls_key_file go together")
        return self

    @model_validator(mode="after")
    def _links_need_a_base(self) -> ServerConfig:
        problem = external_url_problem(self.external_url, self.notifier)
        if problem is not None:
            raise ValueError(problem)
        return self

    @field_validator("guardrails")
    @classmethod
    def _guardrails_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        from controlplane.policy.guardrails import GuardConfig  # pure; imported here to keep settings light

        GuardConfig.model_validate(value)
        return value

    def guard_config(self) -> GuardConfig:
        """The fleet-wide guardrails: ``guardrails``, its ``settle`` by default ``rollout_settle_seconds`` (a
        replica back from a restart counts as serving capacity the same time after it as a rollout's batch)."""
        from controlplane.policy.guardrails import GuardConfig

        return GuardConfig.model_validate({"settle": self.rollout_settle_seconds, **self.guardrails})

    @field_validator("policy_dirs", mode="before")
    @classmethod
    def _split_dirs(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [d.strip() for d in value.split(",") if d.strip()]
        return value

    @field_validator("agent_tokens", "operator_tokens", "viewer_tokens", "admin_tokens", "alertmanager_tokens",
                     mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        # Environment variables carry lists as comma-separated text.
        if isinstance(value, str):
            return [t.strip() for t in value.split(",") if t.strip()]
        return value


def _env_overrides(env: Mapping[str, str]) -> dict[str, str]:
    fields = set(ServerConfig.model_fields)
    out: dict[str, str] = {}
    for key, value in env.items():
        if key.startswith(ENV_PREFIX):
            name = key[len(ENV_PREFIX):].lower()
            if name in fields:
                out[name] = value
    return out


def _describe(exc: ValidationError, origin: str, text: str | None = None) -> str:
    """One line per problem naming where and what; with the file's ``text``, its line too."""
    root = None
    if text is not None:
        try:
            root = yaml.compose(text, Loader=yaml.SafeLoader)
        except yaml.YAMLError:
            root = None
    problems = []
    for err in exc.errors():
        message = str(err["msg"]).removeprefix("Value error, ")
        loc = tuple(p for p in err["loc"] if p not in (_SECRET_TAG, _MAPPING_TAG))
        if root is not None and loc:
            line, field = locate(root, loc)
            problems.append(f"{origin}:{line}: field {field!r}: {message}")
            continue
        field = ".".join(str(p) for p in loc) or "(top level)"
        problems.append(f"{origin}: field {field!r}: {message}")
    return "\n".join(problems)


def load_config(path: str | Path | None = None, env: Mapping[str, str] | None = None) -> ServerConfig:
    """Defaults, overlaid by the YAML file at ``path`` (if any), overlaid by ``PITSTOP_SERVER_*`` variables."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    origin = "defaults"
    if path is not None:
        origin = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from exc
        try:
            loaded = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of settings at the top level")
        data.update(loaded)
    overrides = _env_overrides(env)
    try:
        ServerConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, origin, text if path is not None else None)) from exc
    data.update(overrides)
    try:
        return ServerConfig.model_validate(data)
    except ValidationError as exc:
        names = ", ".join(ENV_PREFIX + k.upper() for k in overrides)
        raise ConfigError(_describe(exc, f"environment ({names})" if names else origin)) from exc
