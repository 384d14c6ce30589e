"""The part of Grafana's dashboard JSON model the Pitstop dashboards use, as plain dataclasses.

A board is rows of panels; ``render`` lays the panels out left to right on Grafana's 24-column grid (a panel
that does not fit starts a new line), numbers them, and writes the JSON Grafana stores (schemaVersion 39).
Every panel reads the ``${datasource}`` variable; every query variable offers "All" as the regex ``.*``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRID_COLUMNS = 24
# Where the runbooks are published (the base of every alert's runbook_url in alerts/pitstop-rules.yml).
RUNBOOK_BASE = "https://pitstop.example.internal/"


def runbook_url(alert: str) -> str:
    return f"{RUNBOOK_BASE}runbooks/alerts/{alert}.md"


@dataclass(frozen=True)
class Step:
    """A threshold step: from ``value`` upwards the colour is ``color`` (the first step has no value)."""

    color: str
    value: float | None = None


def steps(base: str, *rest: tuple[str, float]) -> tuple[Step, ...]:
    return (Step(base), *(Step(color, value) for color, value in rest))


@dataclass(frozen=True)
class Link:
    """A panel link or a data link; ``new_tab`` for pages outside Grafana (runbooks)."""

    title: str
    url: str
    new_tab: bool = False

    def json(self) -> dict[str, Any]:
        return {"title": self.title, "url": self.url, "targetBlank": self.new_tab}


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    instant: bool = False  # one value per series at the end of the range (tables, stats of a whole range)
    table: bool = False


@dataclass(frozen=True)
class Panel:
    """One panel. ``alerts`` are the alerts the panel is the evidence of: each gets a runbook link."""

    title: str
    description: str
    targets: tuple[Target, ...]
    kind: str = "timeseries"  # timeseries | stat | state-timeline | table
    unit: str = "short"
    width: int = 12
    height: int = 8
    thresholds: tuple[Step, ...] = ()
    threshold_style: str = "line"  # timeseries only: line | dashed | area | line+area
    min: float | None = None
    max: float | None = None
    alerts: tuple[str, ...] = ()
    data_links: tuple[Link, ...] = ()
    mappings: tuple[Mapping[str, Any], ...] = ()
    overrides: tuple[Mapping[str, Any], ...] = ()
    custom: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    transformations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    """A query variable over ``label_values(selector, label)``; "All" is ``.*``, so ``=~"$name"`` matches all."""

    name: str
    label: str
    query: str
    multi: bool = True

    def json(self) -> dict[str, Any]:
        return {
            "type": "query", "name": self.name, "label": self.label, "datasource": DATASOURCE,
            "definition": self.query,
            "query": {"query": self.query, "refId": "PrometheusVariableQueryEditor-VariableQuery", "qryType": 1},
            "refresh": 2, "sort": 1, "includeAll": True, "allValue": ".*", "multi": self.multi,
            "current": {}, "options": [], "hide": 0,
        }


@dataclass(frozen=True)
class Annotation:
    """Events from a Prometheus query: one per step where the query has a value, titled from its labels."""

    name: str
    expr: str
    title: str
    text: str
    tags: tuple[str, ...]
    color: str
    step: str = "1m"

    def json(self) -> dict[str, Any]:
        return {
            "name": self.name, "datasource": DATASOURCE, "enable": True, "hide": False, "iconColor": self.color,
            "expr": self.expr, "step": self.step, "titleFormat": self.title, "textFormat": self.text,
            "tagKeys": ",".join(self.tags), "useValueForTime": False,
        }


@dataclass(frozen=True)
class Dashboard:
    uid: str
    title: str
    description: str
    tags: tuple[str, ...]
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...]
    links: tuple[Mapping[str, Any], ...] = ()
    annotations: tuple[Annotation, ...] = ()


def _thresholds(panel: Panel) -> dict[str, Any]:
    chosen = panel.thresholds or steps("green")
    return {"mode": "absolute", "steps": [{"color": s.color, "value": s.value} for s in chosen]}


def _field_defaults(panel: Panel) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.min is not None:
        defaults["min"] = panel.min
    if panel.max is not None:
        defaults["max"] = panel.max
    defaults["thresholds"] = _thresholds(panel)
    if panel.mappings:
        defaults["mappings"] = [dict(m) for m in panel.mappings]
    if panel.data_links:
        defaults["links"] = [link.json() for link in panel.data_links]
    custom = dict(panel.custom)
    if panel.kind == "timeseries":
        custom.setdefault("thresholdsStyle", {"mode": panel.threshold_style if panel.thresholds else "off"})
    if custom:
        defaults["custom"] = custom
    return defaults


def _options(panel: Panel) -> dict[str, Any]:
    if panel.kind == "stat":
        base: dict[str, Any] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background", "graphMode": "none", "textMode": "value_and_name",
            "justifyMode": "auto", "orientation": "auto",
        }
    elif panel.kind == "state-timeline":
        base = {"showValue": "never", "mergeValues": True, "rowHeight": 0.8, "alignValue": "left",
                "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True}}
    elif panel.kind == "table":
        base = {"showHeader": True, "cellHeight": "sm", "footer": {"show": False, "reducer": ["sum"]}}
    else:
        base = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                "tooltip": {"mode": "multi", "sort": "desc"}}
    return base | dict(panel.options)


def _target(ref: str, target: Target) -> dict[str, Any]:
    out: dict[str, Any] = {"refId": ref, "datasource": DATASOURCE, "expr": target.expr,
                           "legendFormat": target.legend or "__auto", "range": not target.instant,
                           "instant": target.instant}
    if target.table:
        out["format"] = "table"
    return out


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    if not 0 < panel.width <= GRID_COLUMNS:
        raise ValueError(f"{panel.title}: width {panel.width} outside 1..{GRID_COLUMNS}")
    out: dict[str, Any] = {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": DATASOURCE, "gridPos": {"h": panel.height, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": _field_defaults(panel), "overrides": [dict(o) for o in panel.overrides]},
        "options": _options(panel),
        "targets": [_target(chr(ord("A") + i), t) for i, t in enumerate(panel.targets)],
    }
    if panel.alerts:
        out["links"] = [Link(f"Runbook: {a}", runbook_url(a), new_tab=True).json() for a in panel.alerts]
    if panel.transformations:
        out["transformations"] = [dict(t) for t in panel.transformations]
    return out


def _layout(rows: Sequence[Row]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row in rows:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row.title, "collapsed": False,
                       "panels": [], "gridPos": {"h": 1, "w": GRID_COLUMNS, "x": 0, "y": y}})
        y += 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > GRID_COLUMNS:
                x, y, line_height = 0, y + line_height, 0
            panels.append(_panel(panel, len(panels) + 1, x, y))
            x += panel.width
            line_height = max(line_height, panel.height)
        y += line_height
    return panels


def render(board: Dashboard) -> dict[str, Any]:
    """The dashboard's JSON model, as Grafana stores it."""
    builtin = {"builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"}, "enable": True,
               "hide": True, "iconColor": "rgba(0, 211, 255, 1)", "name": "Annotations & Alerts",
               "type": "dashboard"}
    datasource = {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
                  "current": {}, "hide": 0, "refresh": 1, "regex": "", "options": []}
    return {
        "uid": board.uid, "title": board.title, "description": board.description, "tags": list(board.tags),
        "timezone": "utc", "schemaVersion": SCHEMA_VERSION, "version": 1, "editable": True, "graphTooltip": 1,
        "refresh": "30s", "time": {"from": "now-6h", "to": "now"}, "timepicker": {},
        "templating": {"list": [datasource, *(v.json() for v in board.variables)]},
        "annotations": {"list": [builtin, *(a.json() for a in board.annotations)]},
        "links": [dict(link) for link in board.links],
        "panels": _layout(board.rows),
    }
