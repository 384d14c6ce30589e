"""Reading the notifier's secrets: every receiver made ready to send, its URL and its secret read.

The config names each secret (inline, a file or an environment variable); ``resolve_secrets`` reads them, with
the environment and the file reader passed in, so a config validates without the secrets at hand and tests need
no files; ``read_secret_file``, the server's reader, is the module's only IO. Every secret is a ``SecretStr``: it
never shows in a repr, a log line, an error or ``model_dump``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from urllib.parse import urlsplit

from pydantic import Field, SecretStr

from controlplane.notify.config import Channel, NotifierConfig, ReceiverKind, Slack
from controlplane.notify.matchers import Route
from controlplane.notify.validation import ConfigModel, is_http_url


class NotifierConfigError(ValueError):
    """Secrets that cannot be read; ``errors`` holds one line per problem, each naming the receiver and field."""

    def __init__(self, errors: Sequence[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = list(errors)


class ResolvedReceiver(ConfigModel):
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


class ResolvedNotifier(ConfigModel):
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


def _read_secret(channel: Channel, env: Mapping[str, str], read_file: Callable[[str], str]) -> SecretStr:
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
        if channel.secret_name is not None and not (isinstance(channel, Slack) and channel.url is not None):
            try:
                secret = _read_secret(channel, env, read_file)
            except _SecretProblem as exc:
                errors.append(f"receiver {receiver.name!r}: {kind}.{exc.field}: {exc}")
                continue
        if isinstance(channel, Slack) and channel.url is not None:
            url = SecretStr(channel.url)
        elif isinstance(channel, Slack):
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
