"""Which receivers take an alert, and which group it joins there: the route tree walked as Alertmanager does. Pure.

Group keys are text built from the receiver, the route and the sorted, escaped group labels, never Python's
``hash``: the same group must get the same key in every process and after every restart, because receivers
merge repeats and resolve incidents by it (Alertmanager's ``groupKey`` as is, PagerDuty's ``dedup_key`` as its
sha256).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from controlplane.notify.matchers import (
    DEFAULT_GROUP_BY,
    DEFAULT_GROUP_INTERVAL,
    DEFAULT_GROUP_WAIT,
    DEFAULT_REPEAT_INTERVAL,
    EVERY_LABEL,
    Route,
    quote_value,
)

ROOT_ROUTE_ID = "{}"
_PLAIN_LABEL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PLAIN_RECEIVER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class RouteMatch:
    """A route an alert went down, with every setting resolved (its own, else inherited, else the default)."""

    # Where the route sits in the tree, Alertmanager-style: ``{}`` for the root, ``{}/{severity="page"}/0`` for
    # its first child; part of the group key, so a config change that moves a route starts new groups.
    route_id: str
    receiver: str
    group_by: tuple[str, ...]
    group_wait: float
    group_interval: float
    repeat_interval: float

    @property
    def every_label(self) -> bool:
        """``group_by: [...]``: each distinct label set is its own group."""
        return EVERY_LABEL in self.group_by

    def group_labels(self, labels: Mapping[str, str]) -> dict[str, str]:
        return group_labels(self.group_by, labels)

    def group_key(self, labels: Mapping[str, str]) -> str:
        return group_key(self.route_id, self.receiver, self.group_by, labels)


def _resolve(route: Route, parent: RouteMatch | None, route_id: str) -> RouteMatch:
    if parent is None:
        if route.receiver is None:
            raise ValueError("the root route needs a receiver")
        parent = RouteMatch(route_id, route.receiver, DEFAULT_GROUP_BY, DEFAULT_GROUP_WAIT, DEFAULT_GROUP_INTERVAL,
                            DEFAULT_REPEAT_INTERVAL)
    return RouteMatch(
        route_id=route_id,
        receiver=route.receiver if route.receiver is not None else parent.receiver,
        group_by=route.group_by if route.group_by is not None else parent.group_by,
        group_wait=route.group_wait if route.group_wait is not None else parent.group_wait,
        group_interval=route.group_interval if route.group_interval is not None else parent.group_interval,
        repeat_interval=route.repeat_interval if route.repeat_interval is not None else parent.repeat_interval,
    )


def _child_id(parent_id: str, child: Route, index: int) -> str:
    return f"{parent_id}/{{{','.join(str(m) for m in child.matchers)}}}/{index}"


def _walk(route: Route, here: RouteMatch, labels: Mapping[str, str]) -> list[RouteMatch]:
    found: list[RouteMatch] = []
    for i, child in enumerate(route.routes):
        if not all(m.matches(labels) for m in child.matchers):
            continue
        found.extend(_walk(child, _resolve(child, here, _child_id(here.route_id, child, i)), labels))
        if not child.continue_:
            break
    return found or [here]


def match(route: Route, labels: Mapping[str, str]) -> list[RouteMatch]:
    """The routes that take an alert with ``labels``, in tree order, starting from the root ``route``.

    As Alertmanager: an alert goes down the first child whose matchers all match, and on to later siblings only
    past a child with ``continue: true``; a node none of whose children match takes the alert itself. The root
    takes every alert, so the list is never empty.
    """
    return _walk(route, _resolve(route, None, ROOT_ROUTE_ID), labels)


def routes(route: Route) -> list[RouteMatch]:
    """Every node of the tree resolved, parents first: the groups' timers and receivers the config allows."""
    out: list[RouteMatch] = []

    def visit(node: Route, here: RouteMatch) -> None:
        out.append(here)
        for i, child in enumerate(node.routes):
            visit(child, _resolve(child, here, _child_id(here.route_id, child, i)))

    visit(route, _resolve(route, None, ROOT_ROUTE_ID))
    return out


def group_labels(group_by: Sequence[str], labels: Mapping[str, str]) -> dict[str, str]:
    """The labels that make the alert's group, sorted by name; absent or empty ones are left out (as absent)."""
    names = labels if EVERY_LABEL in group_by else group_by
    return {name: labels[name] for name in sorted(set(names)) if labels.get(name)}


def group_key(route_id: str, receiver: str, group_by: Sequence[str], labels: Mapping[str, str]) -> str:
    """The group's key, Alertmanager's shape with the receiver first: ``pager/{}:{model="llama",node="gpu-a"}``.

    Values are quoted with ``\\`` and ``"`` escaped (as are names that are not plain), so two different groups
    never make the same key; a receiver name that is not plain is quoted too.
    """
    name = receiver if _PLAIN_RECEIVER.fullmatch(receiver) else quote_value(receiver)
    pairs = ",".join(f"{k if _PLAIN_LABEL.fullmatch(k) else quote_value(k)}={quote_value(v)}"
                     for k, v in group_labels(group_by, labels).items())
    return f"{name}/{route_id}:{{{pairs}}}"
