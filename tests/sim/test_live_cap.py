"""The simulator takes the live-cap plug-in by ``--scheduler-cls`` as vLLM does: it imports it from PYTHONPATH,
says what is in effect in the plug-in's state file, and obeys the cap file from its next step, no restart."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import httpx
import pytest

from agent.live_cap import PLUGIN_DIR, SCHEDULER_CLS
from agent.live_limits import CAP_FILE_VAR
from bench.harness.http import probe
from tests.helpers import wait_until
from tests.sim.conftest import StartSim

pytestmark = pytest.mark.slow  # a real process; nothing here is timed


def state(cap_file: Path) -> dict[str, object]:
    return dict(json.loads(cap_file.with_name(cap_file.name + ".state").read_text()))


def test_the_simulator_runs_the_plugin_and_takes_a_lower_cap_at_its_next_step(start_sim: StartSim,
                                                                              tmp_path: Path) -> None:
    cap_file = tmp_path / "r0.live_cap"
    cap_file.write_text("none\n")
    env = {"PYTHONPATH": os.pathsep.join([str(PLUGIN_DIR), os.environ.get("PYTHONPATH", "")]),
           CAP_FILE_VAR: str(cap_file)}
    sim = start_sim("--max-num-seqs", "8", "--scheduler-cls", SCHEDULER_CLS, env=env)
    first = state(cap_file)
    assert (first["active"], first["startup_limit"], first["cap"], first["requested"]) == (True, 8, 8, None)
    assert first["pid"] == sim.proc.pid and first["vllm"] == "0.33.0"
    assert first["tested"] is False  # the plug-in was run against vLLM 0.32.0, and the simulator says 0.33.0

    cap_file.write_text("2\n")
    # An idle engine takes the file with its next step: one request.
    assert probe.post(f"{sim.url}/v1/completions", json={"model": "test-model", "prompt": "hi", "max_tokens": 2},
                      timeout=30).status_code == 200
    wait_until(lambda: state(cap_file)["cap"] == 2, 10, what="the cap taken")
    assert state(cap_file)["requested"] == 2

    # Three long streams with no cap: all three receive tokens.
    cap_file.write_text("none\n")
    counts = [0, 0, 0]
    threads = [threading.Thread(target=_stream, args=(sim.url, counts, i), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    wait_until(lambda: min(counts) >= 5, 30, what="all three streams running")
    # A cap of one: from the step that reads it, one stream runs and two stand still with their place kept.
    cap_file.write_text("1\n")
    wait_until(lambda: state(cap_file)["cap"] == 1, 10, what="the cap taken")
    settled = list(counts)
    wait_until(lambda: max(c - s for c, s in zip(counts, settled, strict=True)) >= 20, 30,
               what="the capped stream running")  # what was sent before the cap has been read by now
    held_from = list(counts)
    wait_until(lambda: max(c - s for c, s in zip(counts, held_from, strict=True)) >= 40, 30,
               what="the capped stream running on")
    moved = [c - s for c, s in zip(counts, held_from, strict=True)]
    assert sorted(moved)[:2] == [0, 0] and max(moved) >= 40, moved
    # Lifted: the held ones run again, in the same process.
    cap_file.write_text("none\n")
    resumed = list(counts)
    wait_until(lambda: all(c - s >= 10 for c, s in zip(counts, resumed, strict=True) if s < STREAM_TOKENS - 10), 30,
               what="every stream running again")
    for t in threads:
        t.join(timeout=60)
    assert counts == [STREAM_TOKENS] * 3
    assert sim.proc.poll() is None  # the same process throughout


STREAM_TOKENS = 900


def _stream(url: str, counts: list[int], i: int) -> None:
    """One streamed completion; ``counts[i]``: the tokens received so far."""
    body = {"model": "test-model", "prompt": "tell me a long story", "max_tokens": STREAM_TOKENS, "stream": True,
            "ignore_eos": True}
    with httpx.Client(timeout=60) as client, client.stream("POST", f"{url}/v1/completions", json=body) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                counts[i] += 1
