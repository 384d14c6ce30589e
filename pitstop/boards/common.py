"""What the three boards share: drill-down links, the actions annotation, the firing-alerts table."""

from __future__ import annotations

from typing import Any

from pitstop.boards.grafana import RUNBOOK_BASE, Annotation, Link, Panel, Target, steps
from pitstop.boards.promql import Scope

FLEET, GPU, REPLICA = "pitstop-fleet", "pitstop-gpu", "pitstop-replica"

# Every drill-down keeps the time range and the data source; a link names the label values it narrows to.
_KEEP = "${__url_time_range}&var-datasource=${datasource}"

# The label values of the clicked series (time series) or of the clicked row (tables).
SERIES, ROW = "__field.labels", "__data.fields"


def _url(uid: str, **values: str) -> str:
    query = "".join(f"&var-{name}={value}" for name, value in values.items())
    return f"/d/{uid}/{uid}?{_KEEP}{query}"


def to_model(of: str = SERIES) -> Link:
    return Link(f"Fleet, model ${{{of}.model}} only", _url(FLEET, model=f"${{{of}.model}}"))


def to_node(of: str = SERIES) -> Link:
    return Link(f"GPUs of node ${{{of}.node}}", _url(GPU, node=f"${{{of}.node}}"))


def to_replica(of: str = SERIES) -> Link:
    return Link(f"Replica ${{{of}.replica}} on ${{{of}.node}}",
                _url(REPLICA, node=f"${{{of}.node}}", model=f"${{{of}.model}}", replica=f"${{{of}.replica}}"))


def board_links(*others: tuple[str, str]) -> tuple[dict[str, Any], ...]:
    """The dashboard's own links: the other Pitstop boards with this one's variables and time range."""
    menu = {"title": "Pitstop dashboards", "type": "dashboards", "tags": ["pitstop"], "asDropdown": True,
            "includeVars": True, "keepTime": True, "targetBlank": False, "icon": "external link", "tooltip": "",
            "url": ""}
    direct = [{"title": title, "type": "link", "url": f"/d/{uid}/{uid}", "includeVars": True, "keepTime": True,
               "targetBlank": False, "icon": "dashboard", "tooltip": f"{title}, with this board's variables",
               "asDropdown": False, "tags": []} for uid, title in others]
    return (menu, *direct)


# Pitstop's actions as events: one per minute in which an action of a kind reached a final state.
ACTIONS = Annotation(
    name="Pitstop actions",
    expr="sum by (kind, outcome) (increase(pitstop_cp_actions_total[1m])) > 0",
    title="Pitstop {{kind}}: {{outcome}}",
    text="{{kind}} actions reached {{outcome}} (pitstop_cp_actions_total).",
    tags=("kind", "outcome"),
    color="purple",
)

_ALERT_COLUMNS = ("alertname", "severity", "node", "gpu", "model", "engine", "replica")


def firing_alerts(scope: Scope, alerts: tuple[str, ...], *, title: str, description: str,
                  labels: tuple[str, ...] | None = None, required: tuple[str, ...] = (), width: int = 12,
                  height: int = 8) -> Panel:
    """A table of Pitstop's alerts firing now, one row per alert, each row linking its runbook."""
    expr = f"max by ({', '.join(_ALERT_COLUMNS)}) ({scope.alerts(alerts, labels=labels, required=required)})"
    return Panel(
        title=title, kind="table", width=width, height=height,
        description=description + " Alerts are picked by name (every alert in alerts/pitstop-rules.yml), so "
        "those whose expression keeps no job label count too. Click a row for its runbook.",
        targets=(Target(expr, instant=True, table=True),),
        data_links=(Link("Runbook: ${__data.fields.alertname}",
                         f"{RUNBOOK_BASE}runbooks/alerts/${{__data.fields.alertname}}.md", new_tab=True),),
        transformations=({"id": "organize", "options": {
            "excludeByName": {"Time": True, "Value": True},
            "indexByName": {name: i for i, name in enumerate(_ALERT_COLUMNS)},
        }},),
        thresholds=steps("red"),
    )
