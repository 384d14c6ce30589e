"""Reads for the pages: cached a few seconds per token, and the last good answer kept per session.

``st.cache_data`` is keyed by every argument, so one person's token (or the person a service token acts for)
never serves another's page. When the
control plane is away the page keeps showing what it last read, with a banner saying so and since when, never
a stack trace. Writes clear the cache, so the page after a click shows what the click did.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from datetime import UTC, datetime
from typing import Any

import httpx
import streamlit as st

from controlplane.console.client import ApiUnavailable, TokenRefused, _get, auth_headers, tls_context

# Shorter than any refresh: a page's parts read in one run agree, and the next refresh reads anew.
READ_TTL_SECONDS = 2.0
LAST_GOOD_KEY = "pitstop_last_good"
LAST_GOOD_ENTRIES = 64
Params = tuple[tuple[str, Any], ...]


@st.cache_data(ttl=READ_TTL_SECONDS, show_spinner=False, max_entries=512)
def _cached_get(api_url: str, token: str | None, timeout: float, path: str, params: Params,
                on_behalf_of: str | None = None) -> tuple[datetime, Any]:
    with httpx.Client(base_url=api_url, headers=auth_headers(token, on_behalf_of), timeout=timeout,
                      verify=tls_context()) as client:
        return datetime.now(UTC), _get(client, path, dict(params))


def forget() -> None:
    """Drop every cached read (after a write: the next read must show its effect)."""
    _cached_get.clear()


class Reader:
    """GETs for one page run; remembers the oldest data it used and why it used old data."""

    def __init__(self, api_url: str, token: str | None, timeout: float,
                 last_good: MutableMapping[str, Any] | None = None, on_behalf_of: str | None = None) -> None:
        self._api_url, self._token, self._timeout = api_url, token, timeout
        self._on_behalf_of = on_behalf_of
        self._last_good: MutableMapping[str, Any] = {} if last_good is None else last_good
        self.problem: str | None = None
        self.oldest: datetime | None = None

    def get(self, path: str, **params: Any) -> Any:
        """The answer, or the last one read when the control plane is away; ApiUnavailable if there is none."""
        query: Params = tuple(sorted((k, v) for k, v in params.items() if v is not None))
        key = f"{path}?{query!r}"
        try:
            at, data = _cached_get(self._api_url, self._token, self._timeout, path, query, self._on_behalf_of)
        except TokenRefused:
            raise
        except ApiUnavailable as exc:
            self.problem = str(exc)
            if key not in self._last_good:
                raise
            at, data = self._last_good[key]
        else:
            self._last_good.pop(key, None)
            self._last_good[key] = (at, data)
            while len(self._last_good) > LAST_GOOD_ENTRIES:
                self._last_good.pop(next(iter(self._last_good)))
        self.oldest = at if self.oldest is None else min(self.oldest, at)
        return data


def reader_for(api_url: str, token: str | None, timeout: float, on_behalf_of: str | None = None) -> Reader:
    """A Reader whose last good answers live in this browser session's state."""
    last_good = st.session_state.setdefault(LAST_GOOD_KEY, {})
    return Reader(api_url, token, timeout, last_good, on_behalf_of)
