"""Alertmanager's label matchers, and the route tree of ``notifier:`` whose nodes match alerts with them.

Matchers are written and printed in Alertmanager's syntax; silences (``silencing.py``) use them too. Here the
tree is the config's shape and its defaults; ``routing.py`` takes an alert down it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field, PrivateAttr, field_validator, model_validator

from controlplane.notify.validation import ConfigModel, Loc, refuse
from controlplane.policy.durations import Duration

_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

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


class Matcher(ConfigModel):
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

# ``group_by: [...]``: one group per distinct label set, i.e. no grouping at all.
EVERY_LABEL = "..."
# The root route's settings when the config leaves them out; child routes inherit their parent's.
DEFAULT_GROUP_BY: tuple[str, ...] = ("model", "node")
# One notifier tick: a policy's ``for:`` has already debounced each alert, so a longer wait only delays the
# page; but the alerts of one fleet-wide event land over a second or so, and they should be one page per group.
DEFAULT_GROUP_WAIT = 1.0
DEFAULT_GROUP_INTERVAL = 60.0
DEFAULT_REPEAT_INTERVAL = 4 * 3600.0


class Route(ConfigModel):
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
            raise refuse("match and match_re are Alertmanager's old form: write "
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
