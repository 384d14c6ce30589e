"""One colour per replica state and per status, used by every page and chart (so READY is the same green
everywhere, and a WEDGED replica reads the same on the Fleet page as in a replica's chart)."""

from __future__ import annotations

from agent.wire import ReplicaState

# Serving is green; on the way in blue; on the way out amber; stuck or gone red/purple; not ours teal.
STATE_COLOURS: dict[str, str] = {
    ReplicaState.READY.value: "#2e7d32",
    ReplicaState.STARTING.value: "#64b5f6",
    ReplicaState.WARMING.value: "#1e88e5",
    ReplicaState.DRAINING.value: "#ffb300",
    ReplicaState.STOPPING.value: "#fb8c00",
    ReplicaState.STOPPED.value: "#9e9e9e",
    ReplicaState.BACKOFF.value: "#e65100",
    ReplicaState.WEDGED.value: "#8e24aa",
    ReplicaState.FATAL.value: "#c62828",
    ReplicaState.ATTACHED.value: "#00897b",
    ReplicaState.UNREACHABLE.value: "#6d4c41",
}
UNKNOWN_COLOUR = "#bdbdbd"
# Latency quantiles, light to dark as they reach into the tail; indigo, so no quantile reads as a state.
QUANTILE_COLOURS: dict[str, str] = {"p50": "#9fa8da", "p95": "#5c6bc0", "p99": "#283593"}
# A limit drawn across a chart (a GPU's slowdown temperature): the red of a FATAL replica.
LIMIT_COLOUR = STATE_COLOURS[ReplicaState.FATAL.value]
# A fitted trend projected ahead of the readings (memory toward its limit): a grey no state or quantile has.
TREND_COLOUR = "#616161"

# Streamlit's markdown colour names for a status (``:green-badge[…]``), and the icon before a model's name
# (Material icons ship with Streamlit, so they render where a browser has no emoji font).
STATUS_MARKDOWN: dict[str, str] = {"green": "green", "amber": "orange", "red": "red", "unknown": "gray"}
STATUS_DOT: dict[str, str] = {"green": ":green[:material/check_circle:]", "amber": ":orange[:material/warning:]",
                              "red": ":red[:material/error:]", "unknown": ":gray[:material/help:]"}


def state_colour(state: str) -> str:
    return STATE_COLOURS.get(state, UNKNOWN_COLOUR)


def state_scale() -> tuple[list[str], list[str]]:
    """(domain, range) for an Altair colour scale over replica states."""
    return list(STATE_COLOURS), list(STATE_COLOURS.values())


def quantile_scale() -> tuple[list[str], list[str]]:
    """(domain, range) for an Altair colour scale over latency quantiles: p99 the same in every chart."""
    return list(QUANTILE_COLOURS), list(QUANTILE_COLOURS.values())


def badge(status: str, text: str) -> str:
    """Markdown for a coloured badge: ``status`` is green, amber, red or unknown."""
    colour = STATUS_MARKDOWN.get(status, "gray")
    return f":{colour}-badge[{text.replace(']', ')')}]"


def state_badge(state: str, count: int | None = None) -> str:
    """A replica state as a badge in the palette's nearest markdown colour."""
    group = {"READY": "green", "WARMING": "blue", "STARTING": "blue", "ATTACHED": "blue", "STOPPED": "gray",
             "DRAINING": "orange", "STOPPING": "orange", "BACKOFF": "orange", "WEDGED": "violet"}
    colour = group.get(state, "red")
    text = state if count is None else f"{count} {state}"
    return f":{colour}-badge[{text}]"
