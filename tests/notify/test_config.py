"""The notifier's config: the documented shape loads, every mistake is refused naming file, line and field, and
secrets are read only by resolve_secrets and never shown."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from pydantic import SecretStr, ValidationError

from controlplane.notify.config import PAGERDUTY_EVENTS_URL, NotifierConfig, NotifierSettings, describe_errors
from controlplane.notify.matchers import Matcher, parse_matcher
from controlplane.notify.secrets import NotifierConfigError, ResolvedNotifier, read_secret_file, resolve_secrets

SAMPLE = """\
external_url: https://pitstop.example.internal
notifier:
  receivers:
    - {name: pager, pagerduty: {routing_key_file: /etc/pitstop/pd-routing-key}}
    - {name: chat, slack: {webhook_url_file: /etc/pitstop/slack-url}}
    - {name: am-compatible, alertmanager_webhook: {url: "https://hooks.example.internal/am"}}
    - name: signed
      webhook: {url: "https://hooks.example.internal/pitstop", hmac_secret_file: /etc/pitstop/hook-secret}
  route:
    receiver: pager
    group_by: [model, node]
    group_wait: 0s
    group_interval: 1m
    repeat_interval: 4h
    routes:
      - {matchers: ['severity=~"warning|info"'], receiver: chat}
"""

PD_KEY = "pd-key-0123456789abcdef"
SLACK_URL = "https://hooks.slack.com/services/T000/B000/XXXXSLACKSECRET"
HOOK_SECRET = "hmac-secret-value-42"
FILES = {
    "/etc/pitstop/pd-routing-key": PD_KEY + "\n",
    "/etc/pitstop/slack-url": SLACK_URL + "\n",
    "/etc/pitstop/hook-secret": HOOK_SECRET,
}


def read_from(files: dict[str, str]):
    def read(path: str) -> str:
        try:
            return files[path]
        except KeyError:
            raise FileNotFoundError(2, "No such file or directory", path) from None
    return read


def settings(text: str) -> NotifierSettings:
    return NotifierSettings.model_validate(yaml.safe_load(text))


def errors_of(text: str, origin: str = "server.yaml") -> list[str]:
    with pytest.raises(ValidationError) as info:
        settings(text)
    return describe_errors(info.value, text, origin)


def notifier(body: str, external_url: str = "https://pitstop.example.internal") -> str:
    """A server.yaml with ``body`` indented under ``notifier:``."""
    return f"external_url: {external_url}\nnotifier:\n" + textwrap.indent(textwrap.dedent(body), "  ")


def one_receiver(block: str) -> str:
    return notifier(f"receivers:\n  - name: r\n    {block}\nroute: {{receiver: r}}\n")


# --- the documented shape ------------------------------------------------------------------------------------------


def test_the_sample_loads_with_its_defaults():
    s = settings(SAMPLE)
    assert s.external_url == "https://pitstop.example.internal"
    n = s.notifier
    assert n.enabled
    assert [(r.name, r.kind) for r in n.receivers] == [
        ("pager", "pagerduty"), ("chat", "slack"), ("am-compatible", "alertmanager_webhook"), ("signed", "webhook")]
    pager = n.receiver("pager")
    assert pager.pagerduty is not None and pager.pagerduty.url == PAGERDUTY_EVENTS_URL
    assert (pager.timeout_seconds, pager.max_attempts, pager.send_resolved) == (10.0, 10, True)
    route = n.route
    assert route is not None
    assert route.receiver == "pager" and route.group_by == ("model", "node")
    assert (route.group_wait, route.group_interval, route.repeat_interval) == (0.0, 60.0, 4 * 3600.0)
    (child,) = route.routes
    assert child.receiver == "chat" and not child.continue_
    assert child.matchers == (Matcher(name="severity", op="=~", value="warning|info"),)
    # Unset settings stay unset: routing inherits them from the parent.
    assert child.group_by is None and child.group_wait is None


def test_receiver_settings_and_urls():
    text = notifier("""\
        receivers:
          - name: pd
            pagerduty: {url: "http://127.0.0.1:9/enqueue", routing_key: k}
            timeout_seconds: 2.5
            max_attempts: 3
            send_resolved: false
        route: {receiver: pd, group_wait: 30, group_interval: 90s, repeat_interval: 1h30m}
        """)
    n = settings(text).notifier
    pd = n.receiver("pd")
    assert pd.pagerduty is not None and pd.pagerduty.url == "http://127.0.0.1:9/enqueue"
    assert (pd.timeout_seconds, pd.max_attempts, pd.send_resolved) == (2.5, 3, False)
    assert n.route is not None
    assert (n.route.group_wait, n.route.group_interval, n.route.repeat_interval) == (30.0, 90.0, 5400.0)


def test_an_empty_section_turns_the_notifier_off():
    for text in ("{}", "notifier:\n", "notifier: {}\n"):
        s = settings(text)
        assert not s.notifier.enabled and s.notifier.route is None and s.external_url is None


def test_external_url_is_required_with_receivers_and_loses_its_trailing_slash():
    lines = errors_of(SAMPLE.replace("external_url: https://pitstop.example.internal\n", ""))
    assert len(lines) == 1 and lines[0].startswith("server.yaml:1: external_url: required when the notifier")
    assert settings(SAMPLE.replace(".internal\n", ".internal/\n", 1)).external_url == \
        "https://pitstop.example.internal"
    (line,) = errors_of(SAMPLE.replace("https://pitstop.example.internal", "pitstop.example.internal", 1))
    assert line.startswith("server.yaml:1: external_url: expected an absolute http:// or https:// URL")


# --- secrets -------------------------------------------------------------------------------------------------------

# kind, secret field, extra settings the kind needs, where the value lands once resolved
KINDS = [
    ("pagerduty", "routing_key", "", "secret"),
    ("slack", "webhook_url", "", "url"),
    ("webhook", "hmac_secret", 'url: "https://hooks.example.internal/x", ', "secret"),
]
VALUE = "https://hooks.example.internal/the-secret-value"  # a URL, so that it also serves as Slack's


@pytest.mark.parametrize(("kind", "field", "extra", "lands"), KINDS)
@pytest.mark.parametrize("form", ["inline", "file", "env"])
def test_each_secret_form_resolves(kind, field, extra, lands, form):
    given = {"inline": f'{field}: "{VALUE}"', "file": f"{field}_file: /run/secret", "env": f"{field}_env: MY_SECRET"}
    n = settings(one_receiver(f"{kind}: {{{extra}{given[form]}}}")).notifier
    resolved = resolve_secrets(n, {"MY_SECRET": VALUE}, read_from({"/run/secret": VALUE + "\r\n"}))
    r = resolved.receivers["r"]
    assert r.kind == kind
    got = r.url if lands == "url" else r.secret
    assert isinstance(got, SecretStr) and got.get_secret_value() == VALUE
    if kind == "slack":
        assert r.secret is None and r.display_url == "https://hooks.example.internal"


def test_the_sample_resolves_every_receiver():
    resolved = resolve_secrets(settings(SAMPLE).notifier, {}, read_from(FILES))
    r = resolved.receivers
    assert r["pager"].secret is not None and r["pager"].secret.get_secret_value() == PD_KEY
    assert r["pager"].url.get_secret_value() == PAGERDUTY_EVENTS_URL
    assert r["chat"].url.get_secret_value() == SLACK_URL
    assert r["am-compatible"].url.get_secret_value() == "https://hooks.example.internal/am"
    assert r["am-compatible"].secret is None
    assert r["signed"].secret is not None and r["signed"].secret.get_secret_value() == HOOK_SECRET
    assert r["signed"].display_url == "https://hooks.example.internal/pitstop"
    assert resolved.route == settings(SAMPLE).notifier.route


@pytest.mark.parametrize(("kind", "field", "extra", "lands"), KINDS)
def test_two_secret_forms_are_refused(kind, field, extra, lands):
    text = one_receiver(f'{kind}: {{{extra}{field}: "https://h.example/k", {field}_env: X}}')
    (line,) = errors_of(text)
    assert line == (f"server.yaml:5: notifier.receivers[0].{kind}.{field}_env: give one of {field}, {field}_file or "
                    f"{field}_env, not both {field} and {field}_env")


@pytest.mark.parametrize(("kind", "field", "extra", "lands"), KINDS)
def test_a_missing_secret_is_refused(kind, field, extra, lands):
    (line,) = errors_of(one_receiver(f"{kind}: {{{extra}}}".replace(", }", "}")))
    assert line.startswith(f"server.yaml:5: notifier.receivers[0].{kind}: missing {field}: give it as {field} "
                           f"(inline), {field}_file (a file holding it) or {field}_env")


def test_secret_forms_are_checked():
    (line,) = errors_of(one_receiver('pagerduty: {routing_key: ""}'))
    assert line == "server.yaml:5: notifier.receivers[0].pagerduty.routing_key: empty"
    (line,) = errors_of(one_receiver("pagerduty: {routing_key_env: 'not a name'}"))
    assert "pagerduty.routing_key_env: 'not a name' is not an environment variable name" in line
    (line,) = errors_of(one_receiver("slack: {webhook_url: not-a-url-SECRET}"))
    assert line == "server.yaml:5: notifier.receivers[0].slack.webhook_url: not an absolute http(s) URL"
    (line,) = errors_of(one_receiver("slack: {url: http://127.0.0.1:9/hook, webhook_url: https://h/SECRET}"))
    assert line.startswith("server.yaml:5: notifier.receivers[0].slack.url: give url (where to post) or "
                           "webhook_url")
    assert "SECRET" not in line


def test_unreadable_secrets_are_reported_naming_receiver_and_field():
    n = settings(notifier("""\
        receivers:
          - {name: pager, pagerduty: {routing_key_file: /etc/pitstop/pd-routing-key}}
          - {name: chat, slack: {webhook_url_env: SLACK_URL}}
          - {name: signed, webhook: {url: "https://h.example/x", hmac_secret_env: HOOK_SECRET}}
          - {name: empty, pagerduty: {routing_key_file: /etc/pitstop/empty}}
          - {name: chat2, slack: {webhook_url_file: /etc/pitstop/not-a-url}}
        route: {receiver: pager}
        """)).notifier
    files = {"/etc/pitstop/empty": "\n", "/etc/pitstop/not-a-url": "xoxb-SECRET\n"}
    with pytest.raises(NotifierConfigError) as info:
        resolve_secrets(n, {"HOOK_SECRET": ""}, read_from(files))
    assert info.value.errors == [
        "receiver 'pager': pagerduty.routing_key_file: cannot read /etc/pitstop/pd-routing-key: "
        "No such file or directory",
        "receiver 'chat': slack.webhook_url_env: SLACK_URL is not set",
        "receiver 'signed': webhook.hmac_secret_env: HOOK_SECRET is empty",
        "receiver 'empty': pagerduty.routing_key_file: /etc/pitstop/empty is empty",
        "receiver 'chat2': slack.webhook_url_file: /etc/pitstop/not-a-url does not hold an absolute http(s) URL",
    ]
    assert str(info.value) == "\n".join(info.value.errors) and "xoxb" not in str(info.value)


def test_read_secret_file_reads_a_real_file(tmp_path):
    path = tmp_path / "key"
    path.write_text(PD_KEY + "\n", encoding="utf-8")
    n = settings(one_receiver(f"pagerduty: {{routing_key_file: {path}}}")).notifier
    resolved = resolve_secrets(n, {}, read_secret_file)
    assert resolved.receivers["r"].secret is not None
    assert resolved.receivers["r"].secret.get_secret_value() == PD_KEY
    with pytest.raises(NotifierConfigError, match=r"cannot read .*/missing: No such file or directory"):
        resolve_secrets(settings(one_receiver(f"pagerduty: {{routing_key_file: {tmp_path}/missing}}")).notifier,
                        {}, read_secret_file)


def test_secrets_never_show():
    inline = notifier(f"""\
        receivers:
          - {{name: pager, pagerduty: {{routing_key: {PD_KEY}}}}}
          - {{name: chat, slack: {{webhook_url: "{SLACK_URL}"}}}}
          - {{name: signed, webhook: {{url: "https://h.example/x", hmac_secret: {HOOK_SECRET}}}}}
        route: {{receiver: pager}}
        """)
    config = settings(inline)
    resolved = resolve_secrets(settings(SAMPLE).notifier, {}, read_from(FILES))
    secrets = (PD_KEY, SLACK_URL, HOOK_SECRET, "XXXXSLACKSECRET")
    shown: list[str] = []
    for model in (config, config.notifier, config.notifier.receivers[0], resolved, resolved.receivers["chat"]):
        shown += [repr(model), str(model), model.model_dump_json(), str(model.model_dump()),
                  str(model.model_dump(mode="json"))]
    shown += [r.display_url for r in resolved.receivers.values()]
    assert isinstance(resolved, ResolvedNotifier)
    for text in shown:
        for secret in secrets:
            assert secret not in text


def test_secrets_stay_out_of_validation_errors():
    """A mistake beside an inline secret: neither pydantic's text nor the description quotes the secret."""
    text = notifier(f"""\
        receivers:
          - {{name: pager, pagerduty: {{routing_key: {PD_KEY}}}, slack: {{webhook_url: "{SLACK_URL}"}}}}
          - {{name: chat, slack: {{url: "https://relay.example/x", webhook_url: "{SLACK_URL}"}}}}
          - {{name: signed, webhook: {{url: "https://h.example/x", hmac_secret: {HOOK_SECRET}, hmac_secret_env: X}}}}
        route: {{receiver: pager}}
        """)
    with pytest.raises(ValidationError) as info:
        settings(text)
    lines = describe_errors(info.value, text, "server.yaml")
    assert len(lines) == 3
    for shown in (str(info.value), "\n".join(lines)):
        for secret in (PD_KEY, SLACK_URL, HOOK_SECRET):
            assert secret not in shown


# --- receivers -----------------------------------------------------------------------------------------------------


def test_a_receiver_has_exactly_one_kind():
    (line,) = errors_of(one_receiver("send_resolved: true"))
    assert line == ("server.yaml:4: notifier.receivers[0]: a receiver has exactly one of alertmanager_webhook, "
                    "pagerduty, slack, webhook; got none")
    (line,) = errors_of(one_receiver("pagerduty: {routing_key: k}\n    slack: {webhook_url: 'https://h.example/'}"))
    assert line.endswith("got pagerduty and slack")


def test_receiver_names_are_unique_and_plain():
    text = notifier("""\
        receivers:
          - {name: chat, slack: {webhook_url_env: A}}
          - {name: pager, pagerduty: {routing_key_env: B}}
          - {name: chat, slack: {webhook_url_env: C}}
        route: {receiver: pager}
        """)
    (line,) = errors_of(text)
    assert line == "server.yaml:6: notifier.receivers[2].name: receiver 'chat' is already defined (receivers[0])"
    (line,) = errors_of(notifier("receivers:\n  - {name: 'on call', slack: {webhook_url_env: A}}\n"
                                 "route: {receiver: 'on call'}\n"))
    assert "notifier.receivers[0].name: receiver names are letters, digits" in line


def test_receiver_settings_belong_beside_the_name():
    (line,) = errors_of(one_receiver("pagerduty: {routing_key: k, send_resolved: false}"))
    assert line == ("server.yaml:5: notifier.receivers[0].pagerduty: send_resolved belong to the receiver, "
                    "beside its name, not inside its type's block")


def test_generic_webhooks_are_always_signed():
    (line,) = errors_of(one_receiver('webhook: {url: "https://h.example/x"}'))
    assert "webhook: missing hmac_secret" in line
    (line,) = errors_of(one_receiver("webhook: {hmac_secret: s}"))
    assert line == "server.yaml:5: notifier.receivers[0].webhook.url: Field required"
    (line,) = errors_of(one_receiver("alertmanager_webhook: {url: ftp://h.example/x}"))
    assert line == ("server.yaml:5: notifier.receivers[0].alertmanager_webhook.url: expected an absolute http:// "
                    "or https:// URL, got 'ftp://h.example/x'")


# --- routes --------------------------------------------------------------------------------------------------------


def test_unknown_receiver_names_file_line_and_field():
    text = SAMPLE.replace("receiver: chat}", "receiver: chatt}")
    lines = errors_of(text)
    assert lines == ["server.yaml:16: notifier.route.routes[0].receiver: unknown receiver 'chatt'; defined: pager, "
                     "chat, am-compatible, signed"]
    assert text.splitlines()[15].strip().startswith("- {matchers:")


def test_unknown_receivers_everywhere_in_the_tree_are_all_reported():
    text = notifier("""\
        receivers:
          - {name: pager, pagerduty: {routing_key_env: PD}}
          - {name: chat, slack: {webhook_url_env: SLACK}}
        route:
          receiver: pagr
          routes:
            - matchers: [team=infra]
              routes:
                - receiver: chatt
                  matchers: ['severity="info"']
        """)
    assert errors_of(text) == [
        "server.yaml:7: notifier.route.receiver: unknown receiver 'pagr'; defined: pager, chat",
        "server.yaml:11: notifier.route.routes[0].routes[0].receiver: unknown receiver 'chatt'; defined: pager, chat",
    ]


def test_describe_errors_with_the_section_alone():
    text = SAMPLE.replace("receiver: chat}", "receiver: chatt}")
    with pytest.raises(ValidationError) as info:
        NotifierConfig.model_validate(yaml.safe_load(text)["notifier"])
    assert describe_errors(info.value, text, "server.yaml", at=("notifier",)) == [
        "server.yaml:16: notifier.route.routes[0].receiver: unknown receiver 'chatt'; defined: pager, chat, "
        "am-compatible, signed"]
    # Text that is not YAML still gets the file and the field.
    assert describe_errors(info.value, "{", "env") == [
        "env: route.routes[0].receiver: unknown receiver 'chatt'; defined: pager, chat, am-compatible, signed"]


def test_the_root_route():
    base = "receivers:\n  - {name: pager, pagerduty: {routing_key_env: PD}}\n"
    (line,) = errors_of(notifier(base + "route: {group_by: [model]}\n"))
    assert line.startswith("server.yaml:5: notifier.route.receiver: required on the root route")
    (line,) = errors_of(notifier(base + "route: {receiver: pager, matchers: [a=b]}\n"))
    assert line.startswith("server.yaml:5: notifier.route.matchers: the root route takes every alert")
    (line,) = errors_of(notifier(base + "route: {receiver: pager, continue: true}\n"))
    assert line == "server.yaml:5: notifier.route.continue: the root route has no siblings to continue to"
    (line,) = errors_of(notifier(base))
    assert line.startswith("server.yaml:3: notifier.route: required with receivers")
    (line,) = errors_of(notifier("route: {receiver: pager}\n"), "s.yaml")
    assert line == "s.yaml:3: notifier.route.receiver: unknown receiver 'pager'; no receivers are defined"


def test_route_settings_are_checked():
    base = "receivers:\n  - {name: pager, pagerduty: {routing_key_env: PD}}\n"
    (line,) = errors_of(notifier(base + "route: {receiver: pager, group_interval: 0s}\n"))
    assert line == "server.yaml:5: notifier.route.group_interval: must be more than 0s"
    (line,) = errors_of(notifier(base + "route: {receiver: pager, repeat_interval: soon}\n"))
    assert "notifier.route.repeat_interval: invalid duration 'soon'" in line
    (line,) = errors_of(notifier(base + "route: {receiver: pager, group_by: ['...', model]}\n"))
    assert line == "server.yaml:5: notifier.route.group_by: [...] groups by every label: it stands alone"
    (line,) = errors_of(notifier(base + "route: {receiver: pager, group_by: [model, model]}\n"))
    assert line == "server.yaml:5: notifier.route.group_by: model listed twice"
    (line,) = errors_of(notifier(base + "route:\n  receiver: pager\n  routes:\n    - {match: {a: b}}\n"))
    assert line.startswith("server.yaml:8: notifier.route.routes[0]: match and match_re are Alertmanager's old form")
    (line,) = errors_of(notifier(base + "route: {receiver: pager, group_wait: 1m, mute: true}\n"))
    assert line == "server.yaml:5: notifier.route.mute: Extra inputs are not permitted"
    tree = "route: {receiver: pager, group_by: [...], routes: [{group_by: [], continue: true}]}\n"
    n = settings(notifier(base + tree))
    assert n.notifier.route is not None
    assert n.notifier.route.group_by == ("...",) and n.notifier.route.routes[0].group_by == ()
    assert n.notifier.route.routes[0].continue_


# --- matchers ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "name", "op", "value"), [
    ('severity="page"', "severity", "=", "page"),
    ("severity=page", "severity", "=", "page"),
    ("  severity  !=  page ", "severity", "!=", "page"),
    ('severity=~"warning|info"', "severity", "=~", "warning|info"),
    ("severity=~warning|info", "severity", "=~", "warning|info"),
    ('model!~"llama-.*"', "model", "!~", "llama-.*"),
    ('{team="infra"}', "team", "=", "infra"),
    ('team=""', "team", "=", ""),
    ("team=", "team", "=", ""),
    (r'summary="say \"hi\"\\n"', "summary", "=", 'say "hi"\\n'),
    (r'node=~"gpu-\d+"', "node", "=~", r"gpu-\d+"),
    ('x="a,b"', "x", "=", "a,b"),
])
def test_matchers_parse(text, name, op, value):
    assert parse_matcher(text) == {"name": name, "op": op, "value": value}
    m = Matcher.model_validate(text)
    assert (m.name, m.op, m.value) == (name, op, value)
    assert Matcher.model_validate(str(m)) == m  # printed as it parses


@pytest.mark.parametrize(("text", "why"), [
    ('severity=~"(unclosed"', "invalid regular expression: missing ), unterminated subpattern at position 0"),
    ("=", "missing the label name before the operator"),
    ('="page"', "missing the label name before the operator"),
    ("", "empty"),
    ("severity", "expected =, !=, =~ or !~ after 'severity'"),
    ('severity=="page"', "a quote inside an unquoted value: quote the whole value"),
    ('severity="page', "the quoted value has no closing quote"),
    ('severity="page" x', "unexpected 'x' after the quoted value"),
    ("1st=x", "a label name is letters, digits and _, not starting with a digit"),
    ("a=b,c=d", "one matcher per entry (quote a value that holds a comma)"),
    ('{a="b"', "an opening { needs its closing }"),
])
def test_bad_matchers_are_refused_naming_them(text, why):
    doc = notifier(f"""\
        receivers:
          - {{name: pager, pagerduty: {{routing_key_env: PD}}}}
        route:
          receiver: pager
          routes:
            - receiver: pager
              matchers:
                - {yaml.safe_dump(text, default_style="'").strip()}
        """)
    (line,) = errors_of(doc)
    assert line == f"server.yaml:10: notifier.route.routes[0].matchers[0]: bad matcher {text!r}: {why}"


def test_matchers_given_as_fields_are_checked_too():
    assert Matcher.model_validate({"name": "a", "op": "=~", "value": "x|y"}).matches({"a": "y"})
    with pytest.raises(ValidationError, match=r"bad matcher 'a=~\"\(\"': invalid regular expression"):
        Matcher(name="a", op="=~", value="(")
    with pytest.raises(ValidationError, match=r"op\n  Input should be '='"):
        Matcher.model_validate({"name": "a", "op": "==", "value": "x"})


def test_every_receiver_takes_a_url_so_slack_can_post_to_a_local_server():
    loaded = settings(one_receiver("slack: {url: http://127.0.0.1:9099/hook}")).notifier
    resolved = resolve_secrets(loaded, env={}, read_file=lambda path: "")
    [chat] = resolved.receivers.values()
    assert chat.kind == "slack" and chat.url.get_secret_value() == "http://127.0.0.1:9099/hook"
