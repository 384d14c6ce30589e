"""``GET /engines/{replica}/metrics``: an engine's own /metrics, passed through the agent for Prometheus.

Engines usually listen on loopback; the agent's port is the one a node opens to its Prometheus. The control
plane's service discovery (``GET /v1/prometheus/targets?job=pitstop-engines``, docs/design.md "Metrics")
points one scrape target per replica at this path, with the fleet labels (node, replica, model, gpu) as target
labels, so vLLM's histograms and counters reach Prometheus with them and nothing here parses or rewrites the
text. The body is passed through as the engine sent it, capped: an engine streaming without end is refused
(502, and counted by the agent's scrape errors the next time it reads the engine), never buffered whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from agent.lean_client import lean_transport
from agent.plain_http import MAX_BODY_BYTES, BodyTooLarge, body_too_large, prepare, read_capped

# Prometheus's default scrape timeout; it sends its own in X-Prometheus-Scrape-Timeout-Seconds.
DEFAULT_TIMEOUT = 10.0
_PASSED_HEADERS = ("accept",)
# What an engine's body is taken for when it names no content type: Prometheus's text format.
_TEXT_FORMAT = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Proxied:
    """What to answer: the engine's status, body and content type, or the agent's reason it has none."""

    status: int
    body: bytes
    content_type: str


def scrape_timeout(header: str | None, default: float = DEFAULT_TIMEOUT) -> float:
    """The time to give the engine: a little under Prometheus's own timeout, so the agent answers first."""
    try:
        offered = float(header) if header else default
    except ValueError:
        offered = default
    return max(0.5, min(offered, default) - 0.25)


def _refusal(status: int, reason: str) -> Proxied:
    return Proxied(status, (reason + "\n").encode(), "text/plain; charset=utf-8")


async def fetch_engine_metrics(client: httpx.AsyncClient, base_url: str, headers: dict[str, str],
                               within: float, max_bytes: int = MAX_BODY_BYTES) -> Proxied:
    """One engine's /metrics as it sent it; a 503 when it does not answer, a 502 when its body is too big."""
    forward = {k: v for k, v in headers.items() if k.lower() in _PASSED_HEADERS}
    forward["Accept-Encoding"] = "identity"  # loopback: compression costs both sides and saves nothing
    url = base_url.rstrip("/") + "/metrics"
    try:
        lean = lean_transport(client, url)
        if lean is not None and lean.max_body_bytes <= max_bytes:
            # Straight to the agent's transport, on the scrapes' kept connections (the same cap, read as it comes).
            reply = await lean.fetch(prepare(client.build_request("GET", url, headers=forward, timeout=within)))
            content_type = reply.headers.get("content-type", _TEXT_FORMAT)
            return Proxied(reply.status, reply.body, content_type)
        async with client.stream("GET", url, headers=forward, timeout=within) as response:
            body = await read_capped(response, max_bytes)
            content_type = response.headers.get("content-type", _TEXT_FORMAT)
            return Proxied(response.status_code, body, content_type)
    except BodyTooLarge as exc:  # refused while read, by ``read_capped``
        return _refusal(502, f"engine /metrics {exc}")
    except httpx.TimeoutException:
        return _refusal(503, f"engine at {base_url} did not answer /metrics within {within:.1f} s")
    except httpx.HTTPError as exc:
        too_large = body_too_large(exc)  # or by the agent's own transport, before a chunk came back
        if too_large is not None:
            return _refusal(502, f"engine /metrics {too_large}")
        return _refusal(503, f"engine at {base_url} unreachable: {type(exc).__name__}")
