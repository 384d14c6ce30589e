"""The console end to end, in a real browser: a person signs in, reads the fleet an agent reports, and starts a
rolling restart of a model from the Fleet page, then follows it to its end on Actions & incidents.

Real processes on loopback (``tests/console/stack.py``): the control plane, an agent supervising three simulated
engines of one model, and ``pitstop console``, driven through Debian's Chromium. Screenshots of each step are
kept in a folder the test prints (and copied to ``$PITSTOP_ARTIFACTS`` when it is set).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.console import stack as s

pytestmark = pytest.mark.slow


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[s.Stack]:
    with s.running(tmp_path / "stack") as st:
        st.server()
        st.agent(replicas=3)
        st.console(refresh=2)
        st.wait(lambda: st.ready_replicas() == 3, 180, "three READY replicas in the control plane")
        yield st


@pytest.fixture
def shots(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "screenshots"
    folder.mkdir()
    print(f"\nconsole screenshots: {folder}")
    yield folder
    artifacts = os.environ.get("PITSTOP_ARTIFACTS")
    if artifacts:
        dest = Path(artifacts) / "console-e2e"
        shutil.copytree(folder, dest, dirs_exist_ok=True)
        print(f"console screenshots copied to {dest}")


@pytest.fixture
def page(shots: Path) -> Iterator[Any]:
    playwright = pytest.importorskip("playwright.sync_api")
    chromium = s.chromium_path()
    if chromium is None:
        pytest.skip("no chromium to drive")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            tab = browser.new_page(viewport={"width": 1400, "height": 900})
            tab.set_default_timeout(s.UI_TIMEOUT_MS)
            yield tab
            # Whatever the page showed last: on a failure, what the person would have seen.
            tab.screenshot(path=str(shots / "last.png"), full_page=True)
        finally:
            browser.close()


def _until(check: Any, timeout: float, what: str) -> Any:
    """The first truthy answer of ``check`` within ``timeout`` seconds (the page and the API both move on)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.5)


def test_a_person_reads_the_fleet_and_rolls_a_model_from_the_console(fleet: s.Stack, page: Any,
                                                                       shots: Path) -> None:
    s.sign_in(page, fleet.console_url, fleet.person_token)
    assert fleet.person_token not in page.url
    page.get_by_test_id("stSidebar").get_by_text(f"{s.PERSON} (operator)").wait_for()
    page.get_by_text(f"{s.MODEL} · 3 of 3 serving", exact=False).first.wait_for()
    page.screenshot(path=str(shots / "1-fleet.png"), full_page=True)

    # Replicas: every replica the agent runs, with a reading the agent reported (its engine's RSS).
    s.open_page(page, "Replicas")
    s.settled(page)
    api = {f"{r['node']}/{r['name']}": r for r in fleet.get("/v1/replicas")}

    def rows_with_rss() -> list[dict[str, str]] | None:
        rows = s.grid_rows(page, "RSS MiB")
        return rows if all(r.get("RSS MiB") for r in rows) else None

    rows = _until(rows_with_rss, 60, "the replicas' RSS in the table")
    assert sorted(r["replica"] for r in rows) == sorted(api)
    assert {r["state"] for r in rows} == {"READY"}
    row = next(r for r in rows if r["replica"] == f"{s.NODE}/{s.MODEL}-0")
    now = {f"{r['node']}/{r['name']}": r for r in fleet.get("/v1/replicas")}
    reported = [seen[row["replica"]]["process"]["rss_bytes"] / 2**20 for seen in (api, now)]
    # The engine's memory moves a little between two reports; the table shows one of them, in MiB.
    assert min(reported) * 0.9 <= float(row["RSS MiB"]) <= max(reported) * 1.1, (row, reported)
    page.screenshot(path=str(shots / "2-replicas.png"), full_page=True)

    # Nodes & GPUs: GPU 0's tile says the temperature the simulated GPU reports, against its own slowdown.
    s.open_page(page, "Nodes & GPUs")
    tile = page.get_by_test_id("stVerticalBlock").filter(has=page.get_by_text("GPU 0 ·", exact=False)).last
    tile.wait_for()

    def tile_says_api_temperature() -> bool:
        gpu = next(g for g in fleet.get("/v1/gpus") if g["node"] == s.NODE and g["index"] == 0)
        expected = f"{gpu['temperature_celsius']:g} °C / slows at {gpu['slowdown_temperature_celsius']:g}"
        return expected in str(tile.inner_text())

    _until(tile_says_api_temperature, 60, "GPU 0's tile to show the temperature /v1/gpus reports")
    page.screenshot(path=str(shots / "3-nodes.png"), full_page=True)

    # Fleet: the rolling restart, from its button; the dry run's verdict and blast radius come before Confirm.
    s.open_page(page, "Fleet")
    page.get_by_role("button", name=f"Rolling restart of {s.MODEL}").click()
    confirm = page.get_by_role("button", name=f"Confirm: rolling restart of {s.MODEL}")
    confirm.wait_for()
    preview = page.get_by_test_id("stCode").filter(has_text="replicas it stops or restarts").first
    said = str(preview.inner_text())
    assert "guardrails: allowed" in said and "it would be recorded as approved" in said
    assert all(f"{s.NODE}/{s.MODEL}-{i}" in said for i in range(3)), said
    assert fleet.get("/v1/actions") == []  # a dry run records nothing
    page.screenshot(path=str(shots / "4-rolling-restart-preview.png"), full_page=True)
    confirm.click()
    page.get_by_text(f"rolling_restart model:{s.MODEL}:", exact=False).first.wait_for()
    [action] = fleet.get("/v1/actions")
    assert action["kind"] == "rolling_restart" and action["requested_by"] == s.PERSON

    # Actions & incidents: the rollout replica by replica, to "3 of 3", then the action with its outcome.
    s.open_page(page, "Actions & incidents")
    page.get_by_test_id("stProgress").get_by_text("of 3 replicas done", exact=False).first.wait_for()
    page.screenshot(path=str(shots / "5-rollout-in-progress.png"), full_page=True)
    page.get_by_text("3 of 3 replicas done", exact=False).first.wait_for(timeout=180_000)
    page.get_by_text(f"#{action['id']} rolling_restart model:{s.MODEL}: succeeded", exact=False).first.wait_for(
        timeout=180_000)
    s.settled(page)
    page.get_by_test_id("stMarkdown").filter(has_text=f"(requested by {s.PERSON}), approved by {s.PERSON}").wait_for()
    page.get_by_test_id("stMarkdown").filter(has_text="Outcome: 3 replica(s) READY at their new generation").wait_for()
    # The table and the detail are separate reads, each cached for up to READ_TTL_SECONDS: the table may show
    # the rollout running for one more refresh after the detail shows its outcome.
    rows = _until(lambda: [r for r in s.grid_rows(page, "outcome")
                           if r.get("id") == str(action["id"]) and r.get("state") != "running"], 60,
                  "the action's row with its outcome")
    assert rows[0]["state"] == "succeeded" and rows[0]["kind"] == "rolling_restart", rows
    assert rows[0]["by"] == s.PERSON, rows
    page.screenshot(path=str(shots / "6-rollout-succeeded.png"), full_page=True)
    done = fleet.get(f"/v1/actions/{action['id']}")
    assert done["state"] == "succeeded" and done["requested_by"] == s.PERSON
    assert all(r["generation"] >= 1 and r["ready"] for r in fleet.get("/v1/replicas"))
