"""The agent's HTTP clients: httpx's client interface over the lean transport (``agent.plain_http``).

``scrape_client`` is what the agent reads engines with; ``lean_transport`` finds that transport behind a client,
for the scrapes and canaries that send their prepared bytes to it directly.
"""

from __future__ import annotations

import http.cookiejar

import httpx

from agent.plain_http import PlainHttpTransport


class _NoCookies(http.cookiejar.CookieJar):
    """Engines set no cookies, and the agent sends none: keeping them cost a sixth of an idle scrape."""

    def extract_cookies(self, response: object, request: object) -> None:
        return None


class LeanClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` with this transport for ``http://`` (httpx's own for ``https://``) and no cookie
    jar; ``plain`` is that transport, for callers that send a ``Prepared`` request through it directly."""

    def __init__(self, **kwargs: object) -> None:
        self.plain = PlainHttpTransport()
        super().__init__(mounts={"http://": self.plain}, cookies=_NoCookies(), **kwargs)  # type: ignore[arg-type]


def lean_transport(client: httpx.AsyncClient, url: str) -> PlainHttpTransport | None:
    """The transport ``client`` sends ``url`` through when that is this one and may be called directly."""
    return client.plain if isinstance(client, LeanClient) and url.startswith("http://") else None


def scrape_client() -> LeanClient:
    """The agent's scrape client: this transport for ``http://``, httpx's own for ``https://``; no cookie jar."""
    return LeanClient()
