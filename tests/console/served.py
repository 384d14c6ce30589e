"""A control plane for the console's page tests: a fleet built on a fake clock, then served by uvicorn on a
loopback port with the same clock, so the console reads it over real HTTP as it reads a real one.

Tokens: viewer "look", operator "op", admin "boss", agent "agent"; "svc", an operator token that may act on
behalf of the people a trusted proxy names (the console's service token behind a proxy).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from streamlit.testing.v1 import AppTest

from controlplane.api.app import create_app
from controlplane.console.client import ENV_API_URL, ENV_READ_ONLY, ENV_TOKEN
from tests.controlplane.fixtures import T0, FakeClock
from tests.helpers import serve_in_thread
from tests.remediation.fleet import Fleet, SimAgent, fleet, server_config

# Found, never imported: importing the page script would run it outside Streamlit.
APP_PATH = str(importlib.util.find_spec("controlplane.console.app").origin)  # type: ignore[union-attr]
TOKENS = {"viewer_tokens": ["look"], "operator_tokens": ["op", {"token": "svc", "on_behalf_of": True}],
          "admin_tokens": ["boss"], "agent_tokens": ["agent"]}
OPERATOR = {"Authorization": "Bearer op"}
PAGES = ("views/fleet.py", "views/nodes.py", "views/replicas.py", "views/actions.py", "views/alerts.py",
         "views/policies.py")


@contextmanager
def serve(tmp_path: Path, agents: list[SimAgent], build: Callable[[Fleet], None] | None = None,
          **settings: Any) -> Iterator[str]:
    """The fleet ``build`` leaves behind, served (jobs off: nothing moves while the page is read)."""
    clock = FakeClock(T0 - timedelta(minutes=5))
    with fleet(tmp_path, agents, clock, **settings) as f:
        if build is not None:
            build(f)
    app = create_app(server_config(tmp_path, **TOKENS, **settings), clock=clock, run_jobs=False)
    with serve_in_thread(app) as url:
        yield url


def choose_replica(at: AppTest, replica: str | bool = True) -> AppTest:
    """On the Replicas page, open one replica's page as a person does from the list: ``replica``, or the first
    listed (True); nothing when the page lists none, or with False."""
    boxes = [box for box in at.selectbox if box.key == "chart_replica"]
    if replica is not False and boxes and boxes[0].options:
        boxes[0].select(boxes[0].options[0] if replica is True else replica).run()
        assert not at.exception, at.exception
    return at


def open_console(monkeypatch: pytest.MonkeyPatch, api_url: str, token: str | None = None, *,
                 page: str | None = None, read_only: bool = False, replica: str | bool = True) -> AppTest:
    """The console as a browser session opens it; ``token``: the one it was started with (signed in). On the
    Replicas page, ``replica`` is opened as ``choose_replica`` does."""
    monkeypatch.setenv(ENV_API_URL, api_url)
    for name, value in ((ENV_TOKEN, token), (ENV_READ_ONLY, "1" if read_only else None)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    at = AppTest.from_file(APP_PATH, default_timeout=30)
    at.run()
    assert not at.exception, at.exception
    if page is not None:
        at.switch_page(page).run()
        assert not at.exception, at.exception
        if page == "views/replicas.py":
            choose_replica(at, replica)
    return at


def texts(at: AppTest) -> str:
    """Everything the page says, as one text to look in."""
    parts: list[str] = []
    for kind in ("markdown", "caption", "info", "warning", "error", "success", "code", "subheader", "header"):
        parts += [str(e.value) for e in getattr(at, kind)]
    return "\n".join(parts)


def charts(at: AppTest) -> list[tuple[dict[str, Any], list[pd.DataFrame]]]:
    """Each Altair chart on the page, in order: its Vega-Lite spec, and its data as one frame per dataset (a
    layered chart has one per layer)."""
    drawn = []
    for element in at.get("vega_lite_chart"):
        proto: Any = element.proto
        frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in proto.datasets]
        drawn.append((json.loads(proto.spec), frames))
    return drawn


def buttons(at: AppTest) -> list[str]:
    """The buttons of the page itself (the sidebar's "Sign out" left out)."""
    return [b.label for b in at.main.button]


def click(at: AppTest, label: str) -> AppTest:
    next(b for b in at.button if b.label == label).click().run()
    assert not at.exception, at.exception
    return at
