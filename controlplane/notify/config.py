"""The notifier's settings: ``notifier:`` in the server config (receivers and the route tree) and ``external_url``.

The shape follows Alertmanager's wherever it has one, so on-call reads it without a manual: a receiver is one
destination (Alertmanager's webhook, PagerDuty, Slack or a signed webhook), the route tree picks the receivers
of an alert by its labels and says how its group is paced. Validation is pure and whole-section: a route naming
a receiver nobody defined is refused at load, with the line and the field, not at 3 a.m. when it first fires.

Secrets are named here (inline, a file or an environment variable) and read by ``resolve_secrets``, with the
environment and the file reader passed in, so a config validates without the secrets at hand and tests need no
files; ``read_secret_file``, the server's reader, is the module's only IO. Every secret is a ``SecretStr``: it
never shows in a repr, a log line, an error or ``model_dump``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails, PydanticCustomError

from controlplane.policy.durations import Duration
from controlplane.policy.loader import locate

ReceiverKind = Literal["alertmanager_webhook", "pagerduty", "slack", "webhook"]
RECEIVER_KINDS: tuple[ReceiverKind, ...] = ("alertmanager_webhook", "pagerduty", "slack", "webhook")
PAGERDUTY_EVENTS_URL = "https://events.pagerduty.com/v2/enqueue"

# ``group_by: [...]``: one group per distinct label set, i.e. no grouping at all.
EVERY_LABEL = "..."
# The root route's settings when the config leaves them out; child routes inherit their parent's.
DEFAULT_GROUP_BY: tuple[str, ...] = ("model", "node")
# Zero: a policy's ``for:`` has already debounced the alert, so waiting again only delays the page.
DEFAULT_GROUP_WAIT = 0.0
DEFAULT_GROUP_INTERVAL = 60.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0

_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RECEIVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
# Settings of the receiver itself, which Alertmanager users may look for inside the type's block.
_RECEIVER_SETTINGS = ("timeout_seconds", "max_attempts", "send_resolved")

Loc = tuple[str | int, ...]


class NotifierConfigError(ValueError):
    """Secrets that cannot be read; ``errors`` holds one line per problem, each naming the receiver and field."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class _Model(BaseModel):
    # Inputs may hold secrets: keep them out of ValidationError's text (the outermost model's setting counts).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def _invalid(problems: Sequence[tuple[Loc, str]]) -> ValidationError:
    """A ValidationError at locations below the model being validated, so each problem names its own field.

    Raised inside a validator, pydantic prefixes the enclosing locations (``notifier``...), as for its own
    errors. The errors carry no input, so a secret beside the mistake never reaches a log through them.
    """
    return ValidationError.from_exception_data(
        "notifier", [InitErrorDetails(type=PydanticCustomError("value_error", message), loc=loc, input=None)
                     for loc, message in problems])


def _refuse(message: str, loc: Loc = ()) -> ValidationError:
    return _invalid([(loc, message)])


def is_http_url(value: str) -> bool:
    """Absolute http(s) URL with a host: what a receiver can POST to."""
    try:
        parts = urlsplit(value)
        return parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:
        return False


def _http_url(value: str) -> str:
    if not is_http_url(value):
        raise ValueError(f"expected an absolute http:// or https:// URL, got {value!r}")
    return value


def _external_url(value: str) -> str:
    _http_url(value)
    parts = urlsplit(value)
    if parts.query or parts.fragment:
        raise ValueError("the console's base URL takes no query or fragment")
    return value.rstrip("/")


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError(f"{value!r} is not an environment variable name (letters, digits and _)")
    return value


def _file_path(value: str) -> str:
    if not value.strip():
        raise ValueError("empty path")
    return value


HttpUrl = Annotated[str, AfterValidator(_http_url)]
# The console's base URL as people reach it (behind the load balancer), without its trailing slash.
ExternalUrl = Annotated[str, AfterValidator(_external_url)]
EnvName = Annotated[str, AfterValidator(_env_name)]
FilePath = Annotated[str, AfterValidator(_file_path)]


# --- receivers ---------------------------------------------------------------------------------------------------


class _Channel(_Model):
    """A receiver type's block; its secret, if it has one, comes in exactly one of three forms."""

    # The secret's field: ``<name>`` inline, ``<name>_file`` a file holding it, ``<name>_env`` a variable.
    secret_name: ClassVar[str | None] = None

    @model_validator(mode="before")
    @classmethod
    def _receiver_settings_misplaced(cls, data: Any) -> Any:
        if isinstance(data, dict):
            misplaced = [k for k in _RECEIVER_SETTINGS if k in data]
            if misplaced:
                raise _refuse(f"{', '.join(misplaced)} belong to the receiver, beside its name, not inside "
                              "its type's block")
        return data

    @model_validator(mode="after")
    def _one_secret_form(self) -> _Channel:
        name = self.secret_name
        if name is None:
            return self
        forms = [f for f in self.secret_forms() if getattr(self, f) is not None]
        choices = f"{name}, {name}_file or {name}_env"
        if len(forms) > 1:
            raise _refuse(f"give one of {choices}, not both {forms[0]} and {forms[1]}", (forms[1],))
        if not forms:
            raise _refuse(f"missing {name}: give it as {name} (inline), {name}_file (a file holding it) or "
                          f"{name}_env (an environment variable holding it)")
        inline = getattr(self, name)
        if isinstance(inline, SecretStr) and not inline.get_secret_value():
            raise _refuse("empty", (name,))
        return self

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
    """A Slack incoming webhook. Its URL is the secret (anyone holding it can post), so there is no ``url``."""

    secret_name: ClassVar[str | None] = "webhook_url"

    webhook_url: SecretStr | None = None
    webhook_url_file: FilePath | None = None
    webhook_url_env: EnvName | None = None

    @model_validator(mode="before")
    @classmethod
    def _url_is_the_secret(cls, data: Any) -> Any:
        if isinstance(data, dict) and "url" in data:
            raise _refuse("Slack's URL is its secret: give it as webhook_url, webhook_url_file or "
                          "webhook_url_env, not url", ("url",))
        return data

    @field_validator("webhook_url")
    @classmethod
    def _inline_is_url(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and value.get_secret_value() and not is_http_url(value.get_secret_value()):
            raise _refuse("not an absolute http(s) URL")  # neither shown nor kept as the error's input
        return value


class Webhook(_Channel):
    """Pitstop's own JSON, signed with HMAC-SHA256 so the receiving end can tell it from anyone else's POST."""

    secret_name: ClassVar[str | None] = "hmac_secret"

    url: HttpUrl
    hmac_secret: SecretStr | None = None
    hmac_secret_file: FilePath | None = None
    hmac_secret_env: EnvName | None = None


Channel = AlertmanagerWebhook | PagerDuty | Slack | Webhook


class Receiver(_Model):
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
            raise _refuse(f"a receiver has exactly one of {', '.join(RECEIVER_KINDS)}; got {got}")
        return self

    @property
    def kind(self) -> ReceiverKind:
        return next(k for k in RECEIVER_KINDS if getattr(self, k) is not None)

    @property
    def channel(self) -> Channel:
        channel: Channel = getattr(self, self.kind)
        return channel


# --- matchers ----------------------------------------------------------------------------------------------------

MatchOp = Literal["=", "!=", "=~", "!~"]
_OPS: tuple[MatchOp, ...] = ("=~", "!~", "!=", "=")  # two-character operators first


def quote_value(value: str) -> str:
    """Double-quoted with ``\\``, ``"`` and newlines escaped: how Alertmanager prints a matcher's value."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def _unquote(text: str) -> tuple[str, int] | None:
    """The value of the quoted string opening ``text`` and the index past its closing quote; None if unclosed.

    As Alertmanager: ``\\n``, ``\\"`` and ``\\\\`` are escapes; any other backslash is kept, so ``"\\d+"`` is the
    regex ``\\d+``.
    """
    out: list[str] = []
    i = 1
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text):
            nxt = text[i + 1]
            out.append("\n" if nxt == "n" else nxt if nxt in '"\\' else ch + nxt)
            i += 2
            continue
        if ch == '"':
            return "".join(out), i + 1
        out.append(ch)
        i += 1
    return None


def _regex_problem(value: str) -> str | None:
    try:
        re.compile(value)
    except re.error as exc:
        return f"invalid regular expression: {exc}"
    return None


def parse_matcher(text: str) -> dict[str, str]:
    """``name="value"``, ``name!=value``, ``name=~"regex"``, ``name!~"regex"`` (optionally in braces) as fields.

    Raises ValueError naming the matcher and what is wrong with it.
    """

    def bad(why: str) -> ValueError:
        return ValueError(f"bad matcher {text!r}: {why}")

    body = text.strip()
    if body.startswith("{"):
        if not body.endswith("}"):
            raise bad("an opening { needs its closing }")
        body = body[1:-1].strip()
    if not body:
        raise bad("empty")
    found = _LABEL_NAME.match(body)
    name = found.group(0) if found else ""
    rest = body[len(name):].lstrip()
    if not name:
        if rest[:1] in ("=", "!"):
            raise bad("missing the label name before the operator")
        raise bad("a label name is letters, digits and _, not starting with a digit")
    op = next((o for o in _OPS if rest.startswith(o)), None)
    if op is None:
        raise bad(f"expected =, !=, =~ or !~ after {name!r}")
    rest = rest[len(op):].strip()
    if rest.startswith('"'):
        unquoted = _unquote(rest)
        if unquoted is None:
            raise bad("the quoted value has no closing quote")
        value, end = unquoted
        if rest[end:].strip():
            raise bad(f"unexpected {rest[end:].strip()!r} after the quoted value")
    else:
        if '"' in rest:
            raise bad("a quote inside an unquoted value: quote the whole value")
        if "," in rest:
            raise bad("one matcher per entry (quote a value that holds a comma)")
        value = rest
    if op in ("=~", "!~"):
        problem = _regex_problem(value)
        if problem:
            raise bad(problem)
    return {"name": name, "op": op, "value": value}


class Matcher(_Model):
    """One of Alertmanager's label matchers. Regexes are anchored: ``severity=~"warn"`` does not match "warning".

    An absent label reads as the empty string, so ``team=""`` matches alerts without a team.
    """

    name: str
    op: MatchOp
    value: str = ""
    _regex: re.Pattern[str] | None = PrivateAttr(default=None)

    @model_validator(mode="before")
    @classmethod
    def _from_text(cls, data: Any) -> Any:
        return parse_matcher(data) if isinstance(data, str) else data

    @model_validator(mode="after")
    def _compile(self) -> Matcher:
        if not _LABEL_NAME.fullmatch(self.name):
            raise ValueError(f"bad matcher {str(self)!r}: a label name is letters, digits and _, not starting "
                             "with a digit")
        if self.op in ("=~", "!~"):
            problem = _regex_problem(self.value)
            if problem:
                raise ValueError(f"bad matcher {str(self)!r}: {problem}")
            self._regex = re.compile(self.value)
        return self

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.name, "")
        if self.op == "=":
            return value == self.value
        if self.op == "!=":
            return value != self.value
        assert self._regex is not None
        return (self._regex.fullmatch(value) is not None) == (self.op == "=~")

    def __str__(self) -> str:
        return f"{self.name}{self.op}{quote_value(self.value)}"


# --- routes ------------------------------------------------------------------------------------------------------


class Route(_Model):
    """A node of the route tree. Unset settings (None) are inherited from the parent, the root's from defaults.

    An alert goes down the first child whose matchers all match, and on to later siblings only past a child
    with ``continue: true``; when no child matches, the node itself takes it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True, hide_input_in_errors=True)

    receiver: str | None = None
    # Label names whose values make a group; [...] groups by every label; [] puts every alert in one group.
    group_by: tuple[str, ...] | None = None
    # How long a new group waits for more alerts before its first notification.
    group_wait: Duration | None = None
    # How long a group waits before telling of alerts added to it or resolved since its last notification.
    group_interval: Duration | None = None
    # How long before a group whose alerts have not changed is told again.
    repeat_interval: Duration | None = None
    matchers: tuple[Matcher, ...] = ()
    continue_: bool = Field(default=False, alias="continue")
    routes: tuple[Route, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _old_matchers(cls, data: Any) -> Any:
        if isinstance(data, dict) and ("match" in data or "match_re" in data):
            raise _refuse("match and match_re are Alertmanager's old form: write "
                          "matchers: ['name=\"value\"'] or ['name=~\"regex\"']")
        return data

    @field_validator("group_by")
    @classmethod
    def _group_by_labels(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if value is None:
            return None
        if EVERY_LABEL in value and len(value) > 1:
            raise ValueError("[...] groups by every label: it stands alone")
        for name in value:
            if name != EVERY_LABEL and not _LABEL_NAME.fullmatch(name):
                raise ValueError(f"{name!r} is not a label name (letters, digits and _)")
        twice = sorted({n for n in value if value.count(n) > 1})
        if twice:
            raise ValueError(f"{', '.join(twice)} listed twice")
        return value

    @field_validator("group_interval", "repeat_interval")
    @classmethod
    def _positive(cls, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise ValueError("must be more than 0s")
        return value


def walk_routes(route: Route, loc: Loc = ("route",)) -> Iterator[tuple[Loc, Route]]:
    """Every node of the tree, parents first, with its location in the config (``route.routes[0]``...)."""
    yield loc, route
    for i, child in enumerate(route.routes):
        yield from walk_routes(child, (*loc, "routes", i))


# --- the section -------------------------------------------------------------------------------------------------


class NotifierConfig(_Model):
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
                raise _invalid(problems)
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
            raise _invalid(problems)
        return self

    @property
    def enabled(self) -> bool:
        return bool(self.receivers)

    def receiver(self, name: str) -> Receiver:
        return next(r for r in self.receivers if r.name == name)


class NotifierSettings(_Model):
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
            raise _refuse(problem, ("external_url",))
        return self


def external_url_problem(external_url: str | None, notifier: NotifierConfig) -> str | None:
    """Why the pair cannot be used, or None: receivers need absolute links to the console."""
    if notifier.enabled and not external_url:
        return ("required when the notifier has receivers: notifications link to the console, so they need "
                "its absolute URL (https://pitstop.example.internal)")
    return None


# --- secrets -----------------------------------------------------------------------------------------------------


class ResolvedReceiver(_Model):
    """A receiver ready to send: its URL and secret read. Both are SecretStr (URLs may hold tokens)."""

    name: str
    kind: ReceiverKind
    url: SecretStr
    # PagerDuty's routing key or the webhook's HMAC secret; None for Alertmanager's webhook and Slack.
    secret: SecretStr | None = None
    timeout_seconds: float
    max_attempts: int
    send_resolved: bool

    @property
    def display_url(self) -> str:
        """The URL for logs and the console: no credentials, query or fragment; Slack's only to its host."""
        parts = urlsplit(self.url.get_secret_value())
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        path = "" if self.kind == "slack" else parts.path
        return f"{parts.scheme}://{host}{path}"


class ResolvedNotifier(_Model):
    """The notifier's config with every secret read: what the delivery loop uses."""

    receivers: dict[str, ResolvedReceiver] = Field(default_factory=dict)
    route: Route | None = None
    max_retry_interval: float = 300.0
    watchdog_receiver: str | None = None
    watchdog_interval: float = 60.0
    failing_receiver: str | None = None
    failing_after: float = 300.0


class _SecretProblem(Exception):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


def _read_secret(channel: _Channel, env: Mapping[str, str], read_file: Callable[[str], str]) -> SecretStr:
    inline, file_field, env_field = channel.secret_forms()
    value = getattr(channel, inline)
    if isinstance(value, SecretStr):
        return value
    path = getattr(channel, file_field)
    if path is not None:
        try:
            text = read_file(path)
        except OSError as exc:
            raise _SecretProblem(file_field, f"cannot read {path}: {exc.strerror or exc}") from exc
        except ValueError as exc:  # UnicodeDecodeError: a binary file
            raise _SecretProblem(file_field, f"cannot read {path}: not UTF-8 text") from exc
        text = text.rstrip("\r\n")
        if not text:
            raise _SecretProblem(file_field, f"{path} is empty")
        return SecretStr(text)
    name = getattr(channel, env_field)
    if name not in env:
        raise _SecretProblem(env_field, f"{name} is not set")
    if not env[name]:
        raise _SecretProblem(env_field, f"{name} is empty")
    return SecretStr(env[name])


def resolve_secrets(config: NotifierConfig, env: Mapping[str, str],
                    read_file: Callable[[str], str]) -> ResolvedNotifier:
    """Every receiver with its secret read from where the config says; the one place secrets are read.

    ``env`` is the environment (``os.environ``) and ``read_file`` returns a file's text (``read_secret_file``),
    passed in so this stays testable. Raises NotifierConfigError listing every secret that cannot be had.
    """
    errors: list[str] = []
    resolved: dict[str, ResolvedReceiver] = {}
    for receiver in config.receivers:
        channel, kind = receiver.channel, receiver.kind
        secret: SecretStr | None = None
        if channel.secret_name is not None:
            try:
                secret = _read_secret(channel, env, read_file)
            except _SecretProblem as exc:
                errors.append(f"receiver {receiver.name!r}: {kind}.{exc.field}: {exc}")
                continue
        if isinstance(channel, Slack):
            assert secret is not None
            if not is_http_url(secret.get_secret_value()):
                field = next(f for f in channel.secret_forms() if getattr(channel, f) is not None)
                where = getattr(channel, field)
                errors.append(f"receiver {receiver.name!r}: slack.{field}: {where} does not hold an absolute "
                              "http(s) URL")
                continue
            url, secret = secret, None
        else:
            url = SecretStr(channel.url)
        resolved[receiver.name] = ResolvedReceiver(
            name=receiver.name, kind=kind, url=url, secret=secret, timeout_seconds=receiver.timeout_seconds,
            max_attempts=receiver.max_attempts, send_resolved=receiver.send_resolved)
    if errors:
        raise NotifierConfigError(errors)
    return ResolvedNotifier(receivers=resolved, route=config.route, max_retry_interval=config.max_retry_interval,
                            watchdog_receiver=config.watchdog_receiver, watchdog_interval=config.watchdog_interval,
                            failing_receiver=config.failing_receiver, failing_after=config.failing_after)


def read_secret_file(path: str) -> str:
    """A secret file's text: ``resolve_secrets``'s reader in the server."""
    with open(path, encoding="utf-8") as handle:
        return handle.read()


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
