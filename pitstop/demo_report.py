"""What the demo prints: its URLs, each action as it happens, the fault plan and, at the end, the timeline.

Reads the control plane's API (``/v1/actions``, ``/v1/events``) with the demo's operator token; the timeline
itself is ``demo_faults.timeline``'s.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pitstop import demo_faults
from pitstop.demo_faults import Fault

# The demo's one HTTP client, for its readiness probes and its reads of the API. httpx.get would build a client,
# and so load the CA bundle into a TLS context (about 50 ms of CPU), on every probe and every report tick, on the
# cores the demo's own engines need. No connection is kept alive: a probe never reuses one to a process that died.
HTTP = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


@dataclass
class Api:
    """The control plane's read API, with the demo's operator token."""

    url: str
    token: str
    timeout: float = 10.0  # seconds per request: the demo's stop waits on it, so it keeps it short

    def get(self, path: str, **params: int | str) -> list[dict[str, object]]:
        resp = HTTP.get(f"{self.url}{path}", params=params, headers={"Authorization": f"Bearer {self.token}"},
                         timeout=self.timeout)
        resp.raise_for_status()
        return list(resp.json())


def report_actions(api: Api, seen: dict[int, str], clock: float) -> None:
    """Print each action the control plane records, and each change of its state, as it happens."""
    for a in sorted(api.get("/v1/actions", limit=200), key=lambda a: int(str(a["id"]))):
        ident, state = int(str(a["id"])), str(a["state"])
        if seen.get(ident) == state or state == "suppressed":  # a repeat a cooldown held back: the timeline counts it
            continue
        seen[ident] = state
        at = f"t+{time.time() - clock:4.0f}s"
        outcome = f": {a['outcome']}" if a.get("outcome") else ""
        print(f"  {at}  action #{ident} {a['policy'] or a.get('requested_by')}: {a['kind']} {a['target']} "
              f"-> {state}{outcome}", flush=True)


def write_timeline(api: Api | None, faults: Sequence[Fault], clock: float | None, load_stats: Path,
                   out: Path) -> None:
    """Read what Pitstop did from the control plane; print the timeline and write it as JSON. Without the
    control plane (``api`` None: a demo stopped before it was up, or one that does not answer) the timeline is
    still written, with what the demo itself knows and why Pitstop's side is missing."""
    actions: list[Any] = []
    events: list[Any] = []
    read = "the control plane was not up"
    if api is not None:
        try:
            actions = api.get("/v1/actions", limit=1000)
            events = api.get("/v1/events", limit=5000)
            read = "read"
        except (httpx.HTTPError, ValueError) as exc:
            read = f"could not be read: {exc}"
            print(f"pitstop demo: the control plane {read}", file=sys.stderr)
    load = json.loads(load_stats.read_text()) if load_stats.exists() else None
    gpu_of = {f"replica-{i}": i for i in range(64)}
    doc = demo_faults.timeline(faults, clock or time.time(), actions, events, gpu_of, time.time())
    doc["load"] = load
    doc["control_plane"] = read
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print()
    for line in demo_faults.render(doc, load):
        print(line)
    print(f"(written to {out})", flush=True)


def print_plan(faults: Sequence[Fault], overlay: Sequence[demo_faults.Overlay], clock: float) -> None:
    print("Fault timeline (watch the console's actions and replicas):")
    for f in sorted(faults, key=lambda f: f.at):
        when = time.strftime("%H:%M:%S", time.localtime(clock + f.at))
        print(f"  t+{f.at:4.0f}s {when}  {f.what}  -> expect {' or '.join(f.policies)}: {' / '.join(f.kinds)}")
    if overlay:
        print("Demo overlay (the shipped policy files are unchanged; these copies replace them for this run only):")
        for line in demo_faults.overlay_lines(overlay):
            print(line)
    print(flush=True)


def print_banner(urls: Mapping[str, object], replica_urls: list[str], manifest: Path) -> None:
    print()
    print("Pitstop demo is up:")
    if urls["console"]:
        print(f"  console          {urls['console']}")
    print(f"  control plane    {urls['api']}   (API docs: {urls['api_docs']})")
    print(f"  agent /metrics   {urls['agent_metrics']}")
    for url in replica_urls:
        print(f"  replica          {url}   (vLLM API, /metrics)")
    if urls.get("prometheus"):
        print(f"  Prometheus       {urls['prometheus']}   (targets: {urls['prometheus']}/targets)")
    if urls.get("alertmanager"):
        print(f"  Alertmanager     {urls['alertmanager']}")
    print(f"  URLs and the demo's tokens (agent, operator) are in {manifest}. Ctrl-C stops everything.")
    print(flush=True)
