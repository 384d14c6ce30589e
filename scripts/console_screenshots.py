"""Screenshots of the console for the README: a fleet in trouble, and the incident Pitstop handled.

Runs the stack of the console's end-to-end test (``tests/console/stack.py``): the control plane, an agent with three
simulated replicas of one model, and ``pitstop console``, in Chromium. One replica wedges (``/health`` stays 200,
no token comes out) while requests wait on it, and another replica's GPU runs past its slowdown temperature; the
shipped ``stall`` and ``thermal`` policies act, with their windows cut to seconds. A person signs in and the
script saves:

- ``docs/img/console-fleet.png``: the Fleet page with the replica wedged and the hot GPU's alert firing;
- ``docs/img/console-incident.png``: Actions & incidents with the stall restart chosen: who proposed it, the
  guardrails' verdict, its trail, the evidence and the outcome.

    python scripts/console_screenshots.py [--out docs/img]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pitstop.demo_faults import Overlay, write_overlay  # noqa: E402
from tests.console import stack as s  # noqa: E402
from tests.helpers import SteadyTraffic  # noqa: E402

WIDTH, HEIGHT = 1400, 900
WEDGED, HOT = f"{s.MODEL}-1", f"{s.MODEL}-2"
# Past start and warmup on a busy machine: the replica is READY (and in rotation) before it wedges.
HANG_AFTER = 25.0
# Stall waits long enough for the wedged replica to be seen on the Fleet page before it is restarted.
POLICY_WINDOWS = [Overlay("stall", ("condition", "for"), "2m", "40s"),
                  Overlay("thermal", ("condition", "for"), "2m", "10s")]


def _fault_env(clock: Path) -> dict[str, dict[str, str]]:
    # The faults count from one clock file: the engine that replaces the wedged one does not wedge again.
    common = {"PITSTOP_SIM_FAULT_CLOCK_FILE": str(clock)}
    return {WEDGED: {**common, "PITSTOP_SIM_FAULT_HANG_AFTER": f"{HANG_AFTER:g}",
                     "PITSTOP_SIM_FAULT_HANG_GAUGES": "zero"},
            HOT: {**common, "PITSTOP_SIM_FAULT_HOT_GPU_AFTER": "0"}}


def _stall_restart(stack: s.Stack) -> dict[str, Any] | None:
    return next((a for a in stack.get("/v1/actions", limit=50)
                 if a["kind"] == "restart" and a.get("policy") == "stall"), None)


def _until(check: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := check()):
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(1)
    return got


def shoot(work: Path, out: Path) -> list[Path]:
    from playwright.sync_api import sync_playwright

    chromium = s.chromium_path()
    if chromium is None:
        raise SystemExit("no chromium to drive (apt-get install chromium)")
    out.mkdir(parents=True, exist_ok=True)
    clock = work / "fault-clock"
    overlay = write_overlay(work / "policies", POLICY_WINDOWS)
    with s.running(work) as stack, contextlib.ExitStack() as cleanup:
        stack.server({"policy_dir": str(work / "policies"), **overlay})
        work.mkdir(parents=True, exist_ok=True)
        clock.write_text(f"{time.time():.3f}\n")
        stack.agent(replicas=3, env=_fault_env(clock))
        stack.console(refresh=3)
        stack.wait(lambda: stack.ready_replicas() == 3, 180, "READY replicas")
        port = next(r["url"] for r in stack.get("/v1/replicas") if r["name"] == WEDGED).rsplit(":", 1)[1]
        # Requests that wait on the wedged engine: queued work, no token out.
        cleanup.enter_context(SteadyTraffic(int(port), every=1.0, timeout=600))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                page.set_default_timeout(s.UI_TIMEOUT_MS)
                s.sign_in(page, stack.console_url, stack.person_token)
                print("waiting for the wedge and the hot GPU's alert ...", flush=True)
                _until(lambda: any(r["state"] == "WEDGED" for r in stack.get("/v1/replicas"))
                       and any((a.get("labels") or {}).get("alertname") == "pitstop-thermal"
                               for a in stack.get("/v1/alerts", state="firing")), 300, "the wedge and the alert")
                page.get_by_text("1 WEDGED").wait_for()
                page.get_by_text("pitstop-thermal", exact=False).first.wait_for()
                s.settled(page)
                # From the automation line down: the model card, its alerts and what Pitstop did, in one view.
                page.get_by_test_id("stAlert").first.evaluate("e => e.scrollIntoView({block: 'start'})")
                s.settled(page)
                fleet_png = out / "console-fleet.png"
                page.screenshot(path=str(fleet_png))
                print("waiting for Pitstop's restart of the wedged replica ...", flush=True)
                action = _until(lambda: _stall_restart(stack), 300, "the stall policy's restart")
                _until(lambda: stack.get(f"/v1/actions/{action['id']}")["state"] == "succeeded", 300,
                       "the restart to succeed")
                s.open_page(page, "Actions & incidents")
                picker = page.get_by_test_id("stSelectbox").filter(has_text="why")
                picker.click()
                page.get_by_role("option", name=f"#{action['id']} restart", exact=False).click()
                heading = page.get_by_test_id("stMarkdown").filter(
                    has_text=f"#{action['id']} restart replica:{s.NODE}/{WEDGED}: succeeded")
                heading.wait_for()
                page.get_by_text("Outcome:", exact=False).first.wait_for()
                s.settled(page)
                page.evaluate("() => document.activeElement && document.activeElement.blur()")
                picker.evaluate("e => e.scrollIntoView({block: 'start'})")
                page.mouse.move(0, 0)
                s.settled(page)
                incident_png = out / "console-incident.png"
                # Down to the evidence: the stack dump below it names this host's processes and paths.
                kept = page.get_by_test_id("stMarkdown").filter(has_text="Captured before the restart").first
                box = kept.bounding_box()
                bottom = HEIGHT if box is None else min(HEIGHT, int(box["y"]) - 8)
                page.screenshot(path=str(incident_png),
                                clip={"x": 0, "y": 0, "width": WIDTH, "height": bottom})
            finally:
                browser.close()
    return [fleet_png, incident_png]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go (default docs/img)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="pitstop-shots-") as tmp:
        for path in shoot(Path(tmp), args.out):
            print(f"wrote {path} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
