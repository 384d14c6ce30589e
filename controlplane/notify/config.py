"""The notifier's settings: ``notifier:`` in the server config (receivers and the route tree) and ``external_url``.

The shape follows Alertmanager's wherever it has one, so on-call reads it without a manual: a receiver is one
destination (Alertmanager's webhook, PagerDuty, Slack or a signed webhook), the route tree (``matchers.py``)
picks the receivers of an alert by its labels and says how its group is paced. Validation is pure and
whole-section: a route naming a receiver nobody defined is refused at load, with the line and the field, not at
3 a.m. when it first fires.

Secrets are only named here (inline, a file or an environment variable); ``secrets.py`` reads them. Every secret
is a ``SecretStr``: it never shows in a repr, a log line, an error or ``model_dump``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator

from controlplane.notify.matchers import Route, walk_routes
from controlplane.notify.validation import (
    ConfigModel,
    EnvName,
    ExternalUrl,
    FilePath,
    HttpUrl,
    Loc,
    invalid,
    is_http_url,
    refuse,
)
from controlplane.policy.durations import Duration
from controlplane.policy.loader import locate

ReceiverKind = Literal["alertmanager_webhook", "pagerduty", "slack", "webhook"]
RECEIVER_KINDS: tuple[ReceiverKind, ...] = ("alertmanager_webhook", "pagerduty", "slack", "webhook")
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"

_RECEIVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Settings of the receiver itself, which Alertmanager users may look for inside the type's block.
_RECEIVER_SETTINGS = ("timeout_seconds", "max_attempts", "send_resolved")


# --- receivers ---------------------------------------------------------------------------------------------------


class _Channel(ConfigModel):
    """A receiver type's block; its secret, if it has one, comes in exactly one of three forms."""

    # The secret's field: ``<name>`` inline, ``<name>_file`` a file holding it, ``<name>_env`` a variable.
    secret_name: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def _receiver_settings_misplaced(cls, data: Any) -> Any:
        if isinstance(data, dict):
            misplaced = [k for k in _RECEIVER_SETTINGS if k in data]
            if misplaced:
                raise refuse(f"{', '.join(misplaced)} belong to the receiver, beside its name, not inside "
                             "its type's block")
        return data

    @model_validator(mode="after")
    def _one_secret_form(self) -> _Channel:
        self.check_secret_forms()
        return self

    def check_secret_forms(self) -> None:
        """Exactly one of the secret's three forms (overridden where the secret may be absent)."""
        name = self.secret_name
        if name is None:
            return
        forms = [f for f in self.secret_forms() if getattr(self, f) is not None]
        choices = f"{name}, {name}_file or {name}_env"
        if len(forms) > 1:
            raise refuse(f"give one of {choices}, not both {forms[0]} and {forms[1]}", (forms[1],))
        if not forms:
            raise refuse(f"missing {name}: give it as {name} (inline), {name}_file (a file holding it) or "
                         f"{name}_env (an environment variable holding it)")
        inline = getattr(self, name)
        if isinstance(inline, SecretStr) and not inline.get_secret_value():
            raise refuse("empty", (name,))

    def secret_forms(self) -> tuple[str, str, str]:
        name = self.secret_name or ""
        return name, f"{name}_file", f"{name}_env"


class AlertmanagerWebhook(_Channel):
    """Alertmanager's webhook payload (version 4), for tools that already take Alertmanager's notifications."""

    url: HttpUrl


class PagerDuty(_Channel):
    """PagerDuty's Events API v2; the routing key (integration key) picks the service."""

    secret_name: ClassVar[str | None] = "routing_key"

    url: HttpUrl = PAGERDUTY_EVENTS_URL
    routing_key: SecretStr | None = None
    routing_key_file: FilePath | None = None
    routing_key_env: EnvName | None = None


class Slack(_Channel):
    """A Slack incoming webhook. Its URL is the secret (anyone holding it can post): give it as ``webhook_url``
    in one of its three forms. ``url`` instead posts the same messages somewhere else (a local receiver in a
    test, a relay) and needs no secret."""

    secret_name: ClassVar[str | None] = "webhook_url"

    url: HttpUrl | None = None
    webhook_url: SecretStr | None = None
    webhook_url_file: FilePath | None = None
    webhook_url_env: EnvName | None = None

    def check_secret_forms(self) -> None:
        if self.url is None:
            super().check_secret_forms()
            return
        given = [f for f in self.secret_forms() if getattr(self, f) is not None]
        if given:
            raise refuse(f"give url (where to post) or {given[0]} (Slack's webhook), not both", ("url",))

    @field_validator("webhook_url")
    @classmethod
    def _inline_is_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value() and not is_http_url(value.get_secret_value()):
            raise refuse("not an absolute http(s) URL")  # neither shown nor kept as the error's input
        return value


class Webhook(_Channel):
    """Pitstop's own JSON, signed with HMAC-SHA256 so the receiving end can tell it from anyone else's POST."""

    secret_name: ClassVar[str | None] = "hmac_secret"

    url: HttpUrl
    hmac_secret: SecretStr | None = None
    hmac_secret_file: FilePath | None = None
    hmac_secret_env: EnvName | None = None


Channel = AlertmanagerWebhook | PagerDuty | Slack | Webhook


class Receiver(ConfigModel):
    """One destination with its delivery settings; exactly one of the four type blocks says what it is."""

    name: str
    alertmanager_webhook: AlertmanagerWebhook | None = None
    pagerduty: PagerDuty | None = None
    slack: Slack | None = None
    webhook: Webhook | None = None
    # One HTTP attempt at most this long; a delivery is retried through the outbox up to max_attempts times.
    timeout_seconds: float = Field(default=10.0, gt=0)
    max_attempts: int = Field(default=10, ge=1)
    # Also tell the receiver when the group's alerts resolve.
    send_resolved: bool = True

    @field_validator("name")
    @classmethod
    def _name_form(cls, value: str) -> str:
        if not _RECEIVER_NAME.fullmatch(value):
            raise ValueError(f"receiver names are letters, digits, '-', '_' and '.', got {value!r}")
        return value

    @model_validator(mode="after")
    def _exactly_one_kind(self) -> Receiver:
        given = [k for k in RECEIVER_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            got = " and ".join(given) if given else "none"
            raise refuse(f"a receiver has exactly one of {', '.join(RECEIVER_KINDS)}; got {got}")
        return self

    @property
    def kind(self) -> ReceiverKind:
        return next(k for k in RECEIVER_KINDS if getattr(self, k) is not None)

    @property
    def channel(self) -> Channel:
        channel: Channel = getattr(self, self.kind)
        return channel


# --- the section -------------------------------------------------------------------------------------------------


class NotifierConfig(ConfigModel):
    """``notifier:``: with no receivers (the default) the notifier is off and alerts are only stored."""

    receivers: tuple[Receiver, ...] = ()
    route: Route | None = None
    # The longest wait between two attempts of one delivery (backoff doubles from 2 s up to it).
    max_retry_interval: Duration = Field(default=300.0, gt=0)
    # A dead man's switch for the whole paging path: the Watchdog alert always fires and goes only to this
    # receiver (a heartbeat service that pages when the pings stop), every ``watchdog_interval``.
    watchdog_receiver: str | None = None
    watchdog_interval: Duration = Field(default=60.0, gt=0)
    # When deliveries keep failing (one given up, or one waiting longer than ``failing_after``), the
    # NotificationsFailing alert goes only to this receiver: a second path to on-call.
    failing_receiver: str | None = None
    failing_after: Duration = Field(default=300.0, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _empty_section(cls, data: Any) -> Any:
        return {} if data is None else data  # ``notifier:`` with nothing under it

    @model_validator(mode="after")
    def _consistent(self) -> NotifierConfig:
        problems: list[tuple[Loc, str]] = []
        first: dict[str, int] = {}
        for i, receiver in enumerate(self.receivers):
            if receiver.name in first:
                problems.append((("receivers", i, "name"),
                                 f"receiver {receiver.name!r} is already defined (receivers[{first[receiver.name]}])"))
            first.setdefault(receiver.name, i)
        if self.route is None:
            if self.receivers:
                problems.append((("route",), "required with receivers: the route says which receiver takes "
                                             "each alert"))
            if problems:
                raise invalid(problems)
            return self
        root = self.route
        if root.receiver is None:
            problems.append((("route", "receiver"), "required on the root route: it takes every alert that no "
                                                    "child route takes"))
        if root.matchers:
            problems.append((("route", "matchers"), "the root route takes every alert: put matchers on its "
                                                    "child routes"))
        if root.continue_:
            problems.append((("route", "continue"), "the root route has no siblings to continue to"))
        defined = f"defined: {', '.join(first)}" if first else "no receivers are defined"
        for field in ("watchdog_receiver", "failing_receiver"):
            named = getattr(self, field)
            if named is not None and named not in first:
                problems.append(((field,), f"unknown receiver {named!r}; {defined}"))
        for loc, node in walk_routes(root):
            if node.receiver is not None and node.receiver not in first:
                problems.append(((*loc, "receiver"), f"unknown receiver {node.receiver!r}; {defined}"))
        if problems:
            raise invalid(problems)
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.receivers)

    def receiver(self, name: str) -> Receiver:
        return next(r for r in self.receivers if r.name == name)


class NotifierSettings(ConfigModel):
    """The server config's notifier part: ``external_url`` (top level) and ``notifier:``.

    ``ServerConfig`` carries the same two fields; this model validates them alone and checks that they agree.
    """

    # Notifications link to the console; receivers are elsewhere, so links must be absolute.
    external_url: ExternalUrl | None = None
    notifier: NotifierConfig = Field(default_factory=NotifierConfig)

    @model_validator(mode="after")
    def _links_need_base(self) -> NotifierSettings:
        problem = external_url_problem(self.external_url, self.notifier)
        if problem:
            raise refuse(problem, ("external_url",))
        return self


def external_url_problem(external_url: str | None, notifier: NotifierConfig) -> str | None:
    """Why the pair cannot be used, or None: receivers need absolute links to the console."""
    if notifier.enabled and not external_url:
        return ("required when the notifier has receivers: notifications link to the console, so they need "
                "its absolute URL (https://pitstop.example.internal)")
    return None


# --- error reports -----------------------------------------------------------------------------------------------


def _message(error: Mapping[str, Any]) -> str:
    msg = str(error["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if error["type"] == "literal_error":
        msg += f" (got {error.get('input')!r})"
    if error["type"] == "string_type" and isinstance(error.get("input"), bool):
        msg += " (YAML reads yes/no/on/off as booleans: quote the value)"
    return msg


def describe_errors(exc: ValidationError, text: str, origin: str, at: Sequence[str | int] = ()) -> list[str]:
    """One line per problem, ``origin:line: field: message``, for errors of a model validated from ``text``.

    ``at`` is where the validated data sits in the document (``("notifier",)`` for a NotifierConfig validated
    from that key alone); it is empty when the whole document was validated (``ServerConfig``, NotifierSettings).
    Messages never quote inputs, so an inline secret beside a mistake stays out of the report.
    """
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        root = None
    lines = []
    for err in exc.errors():
        loc = (*at, *err["loc"])
        if root is not None:
            line, field = locate(root, loc)
            where = f"{origin}:{line}"
        else:
            field = ".".join(str(p) if isinstance(p, str) else f"[{p}]" for p in loc).replace(".[", "[")
            where = origin
        lines.append(f"{where}: {field}: {_message(err)}" if field else f"{where}: {_message(err)}")
    return lines
