"""The agent's side of the live cap: the setting, the engine it starts, the cap file and the plug-in's state."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.config import ConfigError, parse_config
from agent.desired import Want, plan_wants
from agent.live_cap import PLUGIN_DIR, SCHEDULER_CLS
from agent.live_limits import CAP_FILE_VAR, LiveCap, LiveCapFile
from agent.wire import DesiredState, LiveLimits, ReplicaSpec

VLLM = "node: n1\nreplicas:\n  - name: a\n    model: m\n    port: 8001\n    engine: vllm\n    live_limits: true\n"


def test_a_live_limited_vllm_loads_the_plugin_and_an_explicit_scheduler_is_refused() -> None:
    [replica] = parse_config(VLLM, "agent.yaml", env={}).replicas
    argv = replica.argv()
    assert argv[-2:] == ["--scheduler-cls", SCHEDULER_CLS]
    assert argv.count("--scheduler-cls") == 1
    with pytest.raises(ConfigError) as err:
        parse_config(VLLM + "    args: [--scheduler-cls, my.Scheduler]\n", "agent.yaml", env={})
    assert "agent.yaml:8: replicas.0.args: live_limits puts its own scheduler in place" in str(err.value)


def test_the_simulator_takes_the_plugin_as_vllm_does() -> None:
    [replica] = parse_config(VLLM.replace("engine: vllm", "engine: sim"), "agent.yaml", env={}).replicas
    assert replica.argv()[-2:] == ["--scheduler-cls", SCHEDULER_CLS]


@pytest.mark.parametrize(("change", "line", "says"), [
    (("    port: 8001\n", "    url: http://10.0.0.5:8000\n"), 7, "live_limits needs a managed replica"),
])
def test_live_limits_where_the_agent_cannot_load_the_plugin_name_file_line_and_field(
        change: tuple[str, str], line: int, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(VLLM.replace(*change), "agent.yaml", env={})
    assert f"agent.yaml:{line}: replicas.0.live_limits: {says}" in str(err.value)


def test_off_by_default_and_then_the_engine_is_started_as_before() -> None:
    [replica] = parse_config(VLLM.replace("    live_limits: true\n", ""), "agent.yaml", env={}).replicas
    assert not replica.live_limits and "--scheduler-cls" not in replica.argv()


def test_the_engine_finds_the_plugin_first_on_its_path_and_its_cap_file(tmp_path: Path) -> None:
    live = LiveCapFile(tmp_path / "run" / "a.live_cap")
    env = live.engine_env({"PYTHONPATH": f"/opt/site{os.pathsep}/opt/more", "HOME": "/root"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PLUGIN_DIR), "/opt/site", "/opt/more"]
    assert env[CAP_FILE_VAR] == str(tmp_path / "run" / "a.live_cap") and env["HOME"] == "/root"
    assert (PLUGIN_DIR / "pitstop_live_cap.py").is_file()
    assert live.engine_env({})["PYTHONPATH"] == str(PLUGIN_DIR)


def test_the_cap_file_is_replaced_whole_and_none_means_the_startup_limit(tmp_path: Path) -> None:
    live = LiveCapFile(tmp_path / "run" / "a.live_cap")
    live.write(3)
    assert live.path.read_text() == "3\n"
    live.write(None)
    assert live.path.read_text() == "none\n"
    assert sorted(p.name for p in live.path.parent.iterdir()) == ["a.live_cap"]  # no temporary file left


STATE = {"pid": 4321, "vllm": "0.32.0", "tested": True, "scheduler": "AsyncScheduler", "active": True,
         "reason": None, "startup_limit": 8, "cap": 2, "requested": 2, "error": None, "at": 1.0}


@pytest.mark.parametrize(("written", "expect"), [
    (lambda p: p.write_text(json.dumps(STATE)), lambda s: s.active and s.cap == 2 and s.startup_limit == 8),
    (lambda p: p.write_text(json.dumps({**STATE, "active": False, "reason": "vLLM 0.40's Scheduler has no running",
                                         "cap": 8})),
     lambda s: not s.active and s.reason == "vLLM 0.40's Scheduler has no running"),
    (lambda p: p.write_text("{half"), lambda s: not s.active and "unreadable plug-in state" in s.reason),
    (lambda p: p.write_text(json.dumps({**STATE, "cap": -1})), lambda s: not s.active and "cap" in s.reason),
])
def test_the_plugins_state_is_read_and_a_broken_one_is_reported_not_fatal(
        tmp_path: Path, written: Callable[[Path], object], expect: Callable[..., bool]) -> None:
    live = LiveCapFile(tmp_path / "a.live_cap")
    assert live.state() is None  # nothing written yet: the engine is still starting
    written(live.state_path)
    state = live.state()
    assert state is not None and expect(state), state
    live.forget_state()
    assert live.state() is None


def test_the_plugins_state_is_parsed_again_only_once_the_plugin_replaced_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    live = LiveCapFile(tmp_path / "a.live_cap")

    def replace(state: dict[str, object]) -> None:  # as the plug-in writes it: whole, by rename
        tmp = tmp_path / "state.tmp"
        tmp.write_text(json.dumps(state))
        os.replace(tmp, live.state_path)

    parsed = []
    parse = LiveCapFile._parse

    def counted(self: LiveCapFile) -> LiveLimits | None:
        parsed.append(1)
        return parse(self)

    monkeypatch.setattr(LiveCapFile, "_parse", counted)
    replace(STATE)
    assert [live.state().cap for _ in range(5)] == [2] * 5 and len(parsed) == 1  # type: ignore[union-attr]
    replace({**STATE, "cap": 4, "requested": 4})  # the same size, a new file
    state = live.state()
    assert state is not None and state.cap == 4 and len(parsed) == 2


def test_a_new_live_cap_alone_is_a_change_at_the_same_generation() -> None:
    now = {"a": Want(True, 4, ["--max-num-seqs", "8"], live_cap=None)}
    desired = DesiredState(node="n1", replicas=[ReplicaSpec(name="a", generation=4, engine_args=["--max-num-seqs", "8"],
                                                            live_cap=2)])
    assert plan_wants(desired, now) == {"a": Want(True, 4, ["--max-num-seqs", "8"], live_cap=2)}
    assert plan_wants(desired, {"a": Want(True, 4, ["--max-num-seqs", "8"], live_cap=2)}) == {}
    stale = DesiredState(node="n1", replicas=[ReplicaSpec(name="a", generation=3, live_cap=1)])
    assert plan_wants(stale, now) == {}


def test_a_live_cap_travels_only_once_used() -> None:
    assert "live_cap" not in ReplicaSpec(name="a", generation=1).model_dump(mode="json")
    assert ReplicaSpec(name="a", generation=1, live_cap=3).model_dump(mode="json")["live_cap"] == 3


def test_a_new_cap_is_written_and_said_and_the_plugins_state_is_reported_with_what_was_asked(tmp_path: Path) -> None:
    said: list[tuple[str, str]] = []
    live = LiveCap(tmp_path / "run" / "a.live_cap", lambda kind, message: said.append((kind, message)))
    env = live.starting(None, {"HOME": "/root"})
    assert live.file.path.read_text() == "none\n" and env[CAP_FILE_VAR] == str(live.file.path)
    assert live.status(0) == {}  # the engine has not written its state yet
    live.ask(2)
    assert live.file.path.read_text() == "2\n"
    assert said == [("live_cap", "live cap 2 written for the engine to take at its next step (no restart)")]
    # An idle engine still says its startup limit: what was asked is reported beside it.
    live.file.state_path.write_text(json.dumps({**STATE, "cap": 8, "requested": None}))
    status = live.status(0)
    assert status["live_cap"] == 8 and status["live_limits"].asked == 2  # type: ignore[union-attr]


def test_an_engine_where_the_plugin_is_off_or_untested_is_said_once_per_engine(tmp_path: Path) -> None:
    said: list[str] = []
    live = LiveCap(tmp_path / "a.live_cap", lambda kind, message: said.append(message))
    live.starting(None, {})
    live.file.state_path.write_text(json.dumps({**STATE, "active": False, "reason": "no running list"}))
    assert live.status(0)["live_cap"] is None
    live.status(0)
    assert said == ["live cap not enabled: no running list; a --max-num-seqs change restarts this engine"]
    live.file.state_path.write_text(json.dumps({**STATE, "vllm": "0.40.1", "tested": False}))
    live.status(1)
    live.status(1)
    assert said[1:] == ["live cap active on vLLM 0.40.1, a version its plug-in was not tested on"]
