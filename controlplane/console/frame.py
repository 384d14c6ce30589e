"""What every page shares: who is signed in, the reader, the auto-refresh, and the banner and "last updated".

``app.py`` signs the visitor in and puts the ``Console`` in the session's state; each page module calls
``page(title, body)``, which runs ``body`` inside a fragment that refreshes on its own timer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import httpx
import pandas as pd
import streamlit as st

from controlplane.console import reads
from controlplane.console.client import ApiUnavailable, ConsoleSettings, TokenRefused
from controlplane.console.signin import Identity

CONSOLE_KEY = "pitstop_console"


@dataclass(frozen=True)
class Console:
    settings: ConsoleSettings
    identity: Identity

    def reader(self) -> reads.Reader:
        return reads.reader_for(self.settings.api_url, self.identity.token, self.settings.timeout_seconds,
                                self.identity.on_behalf_of)

    def client(self) -> httpx.Client:
        """A client carrying the signed-in person's token, or the service token and the header naming the
        proxy-named person it acts for: either way, what it writes is recorded under the person's name."""
        return self.settings.client(self.identity.token or "", on_behalf_of=self.identity.on_behalf_of)


def current() -> Console:
    """The console ``app.py`` set up for this session (it runs before every page)."""
    console: Console | None = st.session_state.get(CONSOLE_KEY)
    if console is None:
        st.info("Open the console from its start page to sign in.")
        st.stop()
    return console


Body = Callable[[Console, reads.Reader], None]


def page(title: str, body: Body) -> None:
    """The page's title, then ``body`` refreshed every ``refresh_seconds``, with the banner above it."""
    console = current()
    st.header(title)

    def run() -> None:
        banner = st.container()
        reader = console.reader()
        try:
            body(console, reader)
        except TokenRefused as exc:
            banner.error(str(exc))
        except ApiUnavailable as exc:
            banner.error(f"Control plane unavailable: {exc}")
        else:
            if reader.problem is not None:
                since = "" if reader.oldest is None else f", from {reader.oldest:%H:%M:%S} UTC"
                banner.error(f"Control plane unavailable: {reader.problem}. Showing the last data read{since}.")
        if reader.oldest is not None:
            banner.caption(f"last updated {reader.oldest:%H:%M:%S} UTC · refreshes every "
                           f"{console.settings.refresh_seconds:g}s")

    # A fragment re-runs on its own timer, so the page refreshes without reloading the browser tab.
    st.fragment(run_every=timedelta(seconds=console.settings.refresh_seconds))(run)()


def table(rows: list[dict[str, Any]], empty: str) -> None:
    """A sortable table, or a line saying why there is nothing to show."""
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")
    else:
        st.caption(empty)
