"""Routing as Alertmanager does it (first match, continue, inheritance, anchored regexes) and group keys that are
the same in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from controlplane.notify.config import NotifierSettings
from controlplane.notify.matchers import Matcher, Route
from controlplane.notify.routing import RouteMatch, group_key, group_labels, match, routes

TREE = """\
external_url: https://pitstop.example.internal
notifier:
  receivers:
    - {name: pager, pagerduty: {routing_key_env: PD}}
    - {name: chat, slack: {webhook_url_env: SLACK}}
    - {name: infra, slack: {webhook_url_env: INFRA}}
    - {name: audit, webhook: {url: "https://h.example/audit", hmac_secret_env: AUDIT}}
  route:
    receiver: pager
    group_interval: 2m
    routes:
      - {matchers: ['alertname="PitstopAudit"'], receiver: audit, continue: true, group_by: [...]}
      - matchers: ['team="infra"']
        receiver: infra
        repeat_interval: 1h
        routes:
          - {matchers: ['severity="page"'], receiver: pager, group_wait: 10s}
          - {matchers: ['severity=~"warning|info"'], group_by: [node]}
      - {matchers: ['severity=~"warning|info"'], receiver: chat}
      - {matchers: ['severity=~"warn"'], receiver: chat, group_by: [alertname]}
"""


@pytest.fixture(scope="module")
def root() -> Route:
    route = NotifierSettings.model_validate(yaml.safe_load(TREE)).notifier.route
    assert route is not None
    return route


def receivers(route: Route, **labels: str) -> list[str]:
    return [m.receiver for m in match(route, labels)]


def test_no_matching_child_leaves_the_alert_at_the_root_with_defaults(root):
    (m,) = match(root, {"severity": "page", "model": "llama"})
    assert m == RouteMatch(route_id="{}", receiver="pager", group_by=("model", "node"), group_wait=1.0,
                           group_interval=120.0, repeat_interval=4 * 3600.0)


def test_the_first_matching_child_wins(root):
    assert receivers(root, severity="warning") == ["chat"]
    assert receivers(root, severity="info", team="infra") == ["infra"]


def test_continue_goes_on_to_later_siblings(root):
    ms = match(root, {"alertname": "PitstopAudit", "severity": "warning"})
    assert [m.receiver for m in ms] == ["audit", "chat"]
    assert ms[0].route_id == '{}/{alertname="PitstopAudit"}/0' and ms[0].every_label
    assert ms[1].route_id == '{}/{severity=~"warning|info"}/2'
    # Without a later match, continue leaves only the continuing route: the root does not also take it.
    assert receivers(root, alertname="PitstopAudit") == ["audit"]


def test_children_inherit_unset_settings(root):
    (m,) = match(root, {"team": "infra", "severity": "warning"})
    # receiver from the parent, group_by its own, repeat_interval from the parent, group_interval from the root.
    assert m == RouteMatch(route_id='{}/{team="infra"}/1/{severity=~"warning|info"}/1', receiver="infra",
                           group_by=("node",), group_wait=1.0, group_interval=120.0, repeat_interval=3600.0)
    (m,) = match(root, {"team": "infra", "severity": "page"})
    assert (m.receiver, m.group_by, m.group_wait, m.group_interval, m.repeat_interval) == \
        ("pager", ("model", "node"), 10.0, 120.0, 3600.0)
    # No grandchild matches: the infra route itself takes it.
    (m,) = match(root, {"team": "infra", "severity": "critical"})
    assert (m.route_id, m.receiver, m.repeat_interval) == ('{}/{team="infra"}/1', "infra", 3600.0)


def test_regexes_are_anchored(root):
    # =~"warn" does not match "warning": the warning alert goes to the earlier warning|info route, and a plain
    # "warn" alert reaches the route of =~"warn" alone.
    assert [m.group_by for m in match(root, {"severity": "warn"})] == [("alertname",)]
    assert [m.route_id for m in match(root, {"severity": "warnings"})] == ["{}"]
    warn = Matcher.model_validate('severity=~"warn"')
    assert warn.matches({"severity": "warn"}) and not warn.matches({"severity": "warning"})
    assert not warn.matches({"severity": "prewarn"})
    not_warn = Matcher.model_validate('severity!~"warn"')
    assert not_warn.matches({"severity": "warning"}) and not not_warn.matches({"severity": "warn"})
    either = Matcher.model_validate('severity=~"warning|info"')
    assert either.matches({"severity": "info"}) and not either.matches({"severity": "information"})


def test_equality_matchers_and_absent_labels():
    assert Matcher.model_validate("team=infra").matches({"team": "infra"})
    assert not Matcher.model_validate("team=infra").matches({})
    assert Matcher.model_validate('team=""').matches({})  # absent reads as empty
    assert Matcher.model_validate("team!=infra").matches({})
    assert not Matcher.model_validate("team!=infra").matches({"team": "infra"})
    assert Matcher.model_validate('team=~".*"').matches({})


def test_every_matcher_of_a_route_must_match():
    route = Route.model_validate({"receiver": "a", "routes": [
        {"receiver": "b", "matchers": ["team=infra", 'severity="page"']}]})
    assert [m.receiver for m in match(route, {"team": "infra", "severity": "page"})] == ["b"]
    assert [m.receiver for m in match(route, {"team": "infra"})] == ["a"]


def test_routes_lists_every_node_resolved(root):
    ids = [m.route_id for m in routes(root)]
    assert ids == ["{}", '{}/{alertname="PitstopAudit"}/0', '{}/{team="infra"}/1',
                   '{}/{team="infra"}/1/{severity="page"}/0', '{}/{team="infra"}/1/{severity=~"warning|info"}/1',
                   '{}/{severity=~"warning|info"}/2', '{}/{severity=~"warn"}/3']
    assert len(set(ids)) == len(ids)


def test_a_root_without_receiver_cannot_route():
    with pytest.raises(ValueError, match="root route needs a receiver"):
        match(Route(), {})


# --- groups --------------------------------------------------------------------------------------------------------

LABELS = {"alertname": "PitstopStall", "model": "llama", "node": "gpu-a", "replica": "r2", "severity": "page"}


def test_group_labels_are_the_group_by_labels_present():
    assert group_labels(("node", "model"), LABELS) == {"model": "llama", "node": "gpu-a"}
    assert list(group_labels(("node", "model"), LABELS)) == ["model", "node"]
    assert group_labels(("model", "zone"), {"model": "llama", "zone": ""}) == {"model": "llama"}
    assert group_labels((), LABELS) == {}
    assert group_labels(("...",), LABELS) == dict(sorted(LABELS.items()))


def test_group_key_is_readable_and_fixed():
    """Written out, so a change of format (which would split every open group) is a visible decision."""
    assert group_key("{}", "pager", ("model", "node"), LABELS) == 'pager/{}:{model="llama",node="gpu-a"}'
    assert group_key('{}/{severity=~"warning|info"}/2', "chat", ("...",), {"b": "2", "a": "1"}) == \
        'chat/{}/{severity=~"warning|info"}/2:{a="1",b="2"}'
    assert group_key("{}", "pager", (), LABELS) == "pager/{}:{}"


def test_group_key_is_the_same_in_another_process():
    code = ("from controlplane.notify.routing import group_key; "
            "print(group_key('{}', 'pager', ('model', 'node', 'zone'), {'zone': 'é', 'node': 'n', 'model': 'm'}))")
    repo = Path(__file__).resolve().parents[2]
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo,
                           env={"PYTHONHASHSEED": seed, "PYTHONIOENCODING": "utf-8"}).stdout.strip()
            for seed in ("1", "2", "3")}
    assert keys == {group_key("{}", "pager", ("model", "node", "zone"), {"model": "m", "node": "n", "zone": "é"})}


def test_group_key_separates_what_differs():
    base = group_key("{}", "pager", ("model", "node"), LABELS)
    assert group_key("{}", "pager", ("model", "node"), {**LABELS, "node": "gpu-b"}) != base
    assert group_key("{}", "chat", ("model", "node"), LABELS) != base
    assert group_key('{}/{a="b"}/0', "pager", ("model", "node"), LABELS) != base
    # Labels outside group_by and their order do not matter.
    assert group_key("{}", "pager", ("node", "model"), dict(reversed(LABELS.items()))) == base
    assert group_key("{}", "pager", ("model", "node"), {**LABELS, "replica": "r9"}) == base


def test_group_key_escapes_values_so_groups_never_collide():
    sly = group_key("{}", "r", ("a", "b"), {"a": 'x",b="y'})
    plain = group_key("{}", "r", ("a", "b"), {"a": "x", "b": "y"})
    assert sly != plain and sly == 'r/{}:{a="x\\",b=\\"y"}'
    assert group_key("{}", "r", ("a",), {"a": "x\n"}) != group_key("{}", "r", ("a",), {"a": "x\\n"})
    assert group_key("{}", "r", ("...",), {"a-b": "1"}) == 'r/{}:{"a-b"="1"}'
    assert group_key("{}", "a/b", (), {}) != group_key("{}/b", "a", (), {})


def test_a_match_gives_its_group(root):
    (m,) = match(root, {**LABELS, "severity": "warning"})
    assert m.group_labels(LABELS) == {"model": "llama", "node": "gpu-a"}
    assert m.group_key(LABELS) == 'chat/{}/{severity=~"warning|info"}/2:{model="llama",node="gpu-a"}'
