"""Altair charts for the console, all coloured from ``palette``. Each returns a chart; the page draws it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import altair as alt
import pandas as pd

from controlplane.console import palette


def lines(points: Sequence[dict[str, Any]], unit: str, height: int = 220,
          scale: tuple[list[str], list[str]] | None = None) -> alt.Chart:
    """One line per series over time (points from ``replica_view.long_series``); ``scale``: (domain, range)
    from ``palette`` when a series must keep its colour from chart to chart (the quantiles)."""
    frame = pd.DataFrame(list(points), columns=["at", "series", "value"])
    colour = (alt.Color("series:N", title=None) if scale is None
              else alt.Color("series:N", title=None, scale=alt.Scale(domain=scale[0], range=scale[1])))
    return (alt.Chart(frame, height=height)
            .mark_line(point=len(frame) < 30)
            .encode(x=alt.X("at:T", title=None), y=alt.Y("value:Q", title=unit),
                    color=colour, tooltip=["at:T", "series:N", "value:Q"]))


def lines_to_limit(points: Sequence[dict[str, Any]], unit: str, limit: float | None, label: str = "",
                   height: int = 220, projection: Sequence[dict[str, Any]] = ()) -> alt.Chart | alt.LayerChart:
    """``lines`` with a dashed rule at ``limit`` (a GPU's slowdown temperature, a host's memory) when there is
    one, and a fitted trend dashed on from the last point (``projection.line``: at, value) toward it. The layers
    share the scales, so the axes reach the limit and the projection's end, and the headroom left is what the
    eye reads."""
    chart: alt.Chart | alt.LayerChart = lines(points, unit, height)
    if projection:
        trend = (alt.Chart(pd.DataFrame([{**p, "trend": "projected"} for p in projection],
                                        columns=["at", "value", "trend"]))
                 .mark_line(color=palette.TREND_COLOUR, strokeDash=[3, 3], size=2)
                 .encode(x="at:T", y="value:Q", tooltip=["trend:N", "at:T", "value:Q"]))
        chart = chart + trend
    if limit is not None:
        rule = (alt.Chart(pd.DataFrame([{"value": limit, "limit": label}]))
                .mark_rule(color=palette.LIMIT_COLOUR, strokeDash=[6, 4], size=2)
                .encode(y="value:Q", tooltip=["limit:N", "value:Q"]))
        chart = chart + rule
    return chart


def timeline(rows: Sequence[dict[str, Any]], height: int = 120) -> alt.Chart:
    """A replica's state over time: one bar per state held, in the palette's state colours."""
    frame = pd.DataFrame([r for r in rows if r["state"]], columns=["at", "state", "from", "kind", "message"])
    frame = frame.sort_values("at")
    frame["until"] = frame["at"].shift(-1).fillna(frame["at"].max())
    domain, colours = palette.state_scale()
    return (alt.Chart(frame, height=height)
            .mark_bar(size=24)
            .encode(x=alt.X("at:T", title=None), x2="until:T", y=alt.value(40),
                    color=alt.Color("state:N", scale=alt.Scale(domain=domain, range=colours), title="state"),
                    tooltip=["at:T", "from:N", "state:N", "message:N"]))


def states(counts: dict[str, int], height: int = 60) -> alt.Chart:
    """Replicas by state as one stacked bar in the state colours."""
    frame = pd.DataFrame([{"state": s, "replicas": n} for s, n in counts.items()], columns=["state", "replicas"])
    domain, colours = palette.state_scale()
    return (alt.Chart(frame, height=height)
            .mark_bar()
            .encode(x=alt.X("replicas:Q", stack="zero", axis=None),
                    color=alt.Color("state:N", scale=alt.Scale(domain=domain, range=colours), legend=None),
                    tooltip=["state:N", "replicas:Q"]))
