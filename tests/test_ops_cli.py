"""On-call's terminal commands against the real app: what they print, what they send, and their exit codes."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from agent.wire import ReplicaState, ReplicaStatus
from controlplane.api.app import create_app
from controlplane.config import ServerConfig
from controlplane.remediation.executor import reconcile
from controlplane.store.db import session_scope
from pitstop import ops
from pitstop.ops import Io
from pitstop.opscli import run
from pitstop.opsclient import ENV_CONFIG, ENV_TOKEN, ENV_URL, Exit, resolve
from tests.controlplane.fixtures import FakeClock, body, replica, report


class Fleet:
    def __init__(self, app: Any, clock: FakeClock) -> None:
        self.app, self.clock, self.seq = app, clock, 0

    def client(self, token: str) -> TestClient:
        return TestClient(self.app, headers={"Authorization": f"Bearer {token}"})

    def send(self, *replicas: ReplicaStatus, node: str = "gpu-a") -> None:
        self.seq += 1
        r = report(node, sequence=self.seq, replicas=list(replicas), sent_at=self.clock())
        assert self.client("agent").post(f"/v1/agents/{node}/report", json=body(r)).status_code == 200

    def reconcile(self) -> None:
        with session_scope(self.app.state.pitstop.sessions) as session:
            reconcile(session=session, now=self.clock(), deadline=timedelta(seconds=300))


@pytest.fixture
def fleet(tmp_path: Path, clock: FakeClock) -> Iterator[Fleet]:
    config = ServerConfig(database_url=f"sqlite:///{tmp_path / 'cp.db'}", operator_tokens=["ops"],
                          admin_tokens=["root"], agent_tokens=["agent"], viewer_tokens=["look"])
    app = create_app(config, clock=clock, run_jobs=False)
    with TestClient(app):
        yield Fleet(app, clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def cli(fleet: Fleet, token: str, *argv: str, answer: str | None = None,
        sleep: Callable[[float], None] = lambda _: None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    ask = None if answer is None else (lambda _prompt: answer)
    code = run(argv[0], argv[1:], client=fleet.client(token), io=Io(out=out, err=err, ask=ask, sleep=sleep))
    return code, out.getvalue(), err.getvalue()


def three(fleet: Fleet, generation: int = 1) -> None:
    fleet.send(*[replica(f"r{i}").model_copy(update={"generation": generation}) for i in range(3)])


def test_status_shows_each_model_against_its_slo_and_exits_1_when_one_is_red(fleet: Fleet) -> None:
    code, out, _ = cli(fleet, "look", "status")
    assert code == Exit.OK and "no replica has reported yet" in out
    fleet.send(replica("r0"), replica("r1", ttft=0.9))
    code, out, _ = cli(fleet, "look", "status")
    assert code == Exit.HELD
    header, row = out.splitlines()[:2]
    assert header.split()[:3] == ["MODEL", "STATUS", "READY"]
    assert row.split()[:4] == ["tiny-llama", "red", "2/2", "900ms/500ms"]
    assert "nodes: 1 up, 0 stale, 0 cordoned (of 1)" in out
    code, out, _ = cli(fleet, "look", "status", "--json")
    assert json.loads(out)["models"][0]["status"] == "red"


def test_replicas_are_listed_and_filtered(fleet: Fleet) -> None:
    fleet.send(replica("r0"), replica("m0", model="mistral-7b", state=ReplicaState.WARMING))
    code, out, _ = cli(fleet, "look", "replicas", "--model", "mistral-7b")
    assert code == Exit.OK
    lines = out.splitlines()
    assert len(lines) == 2 and lines[1].split()[:3] == ["gpu-a/m0", "mistral-7b", "WARMING"]


def test_a_rollout_previews_then_runs_when_confirmed_and_waits_to_the_end(fleet: Fleet) -> None:
    three(fleet)
    code, out, _ = cli(fleet, "ops", "rollout", "tiny-llama", "--dry-run")
    assert code == Exit.OK
    assert out.strip() == ("rolling_restart model:tiny-llama: restarts 3 replicas of tiny-llama, 1 at a time; "
                           "2 of 3 stay serving throughout")
    assert fleet.client("look").get("/v1/actions").json() == []
    code, _, err = cli(fleet, "ops", "rollout", "tiny-llama", answer="n")
    assert code == Exit.OK and "nothing sent" in err and fleet.client("look").get("/v1/actions").json() == []

    # Confirmed and waited on: each wait the time passes and the agents converge the batch in flight, as real
    # ones would (a batch READY settles for the rollout's settle time before the next starts).
    def converge(seconds: float) -> None:
        fleet.clock.advance(seconds)
        fleet.reconcile()
        desired = {d["name"]: d["generation"] for d in fleet.client("ops").get("/v1/desired").json()}
        fleet.send(*[replica(f"r{i}").model_copy(update={"generation": desired.get(f"r{i}", 1)}) for i in range(3)])

    code, out, _ = cli(fleet, "ops", "rollout", "tiny-llama", "--wait", answer="y", sleep=converge)
    assert code == Exit.OK
    lines = out.splitlines()
    assert lines[1].startswith("action ") and lines[1].endswith("running [0 of 3 done, rolling]")
    assert lines[-1].split(" [")[0].endswith("succeeded")
    # Between batches, each READY batch settles back into rotation before the next leaves it, and says so.
    assert any(line.endswith("[1 of 3 done, rolling]") for line in lines)
    assert any("[0 of 3 done, rolling; settling: gpu-a/r0 READY for" in line for line in lines), lines
    [done] = fleet.client("look").get("/v1/actions").json()
    assert done["state"] == "succeeded" and done["requested_by"] == "config:operator-0"


def test_a_second_rollout_is_a_conflict_and_a_script_must_say_yes(fleet: Fleet) -> None:
    three(fleet)
    code, _, err = cli(fleet, "ops", "rollout", "tiny-llama")  # no terminal to ask on
    assert code == Exit.USAGE and "pass --yes" in err
    assert cli(fleet, "ops", "rollout", "tiny-llama", "--yes")[0] == Exit.OK
    code, _, err = cli(fleet, "ops", "rollout", "tiny-llama", "--yes")
    assert code == Exit.CONFLICT and "already running" in err


def test_a_rollout_of_a_new_max_num_seqs_goes_to_a_canary_first(fleet: Fleet) -> None:
    three(fleet)
    code, out, _ = cli(fleet, "ops", "rollout", "tiny-llama", "--max-num-seqs", "32", "--canary", "gpu-a/r2", "--yes")
    assert code == Exit.OK
    assert out.splitlines()[0].startswith("lower_max_num_seqs replica:gpu-a/r2: tries --max-num-seqs 32 (now 64)")
    [made] = fleet.client("look").get("/v1/actions").json()
    assert made["kind"] == "lower_max_num_seqs" and made["params"]["canary"] is True
    code, _, err = cli(fleet, "ops", "rollout", "tiny-llama", "--max-num-seqs", "16", "--yes")
    assert code == Exit.CONFLICT and "one change of a model's flags at a time" in err


def test_an_action_the_budget_holds_is_not_sent(fleet: Fleet) -> None:
    fleet.send(replica("r0"), replica("r1", state=ReplicaState.STARTING))
    code, out, err = cli(fleet, "ops", "restart", "gpu-a/r0", "--yes")
    assert code == Exit.HELD
    assert "held by the disruption budget" in out and "not sent" in err
    assert fleet.client("look").get("/v1/actions").json() == []
    code, out, _ = cli(fleet, "root", "drain", "gpu-a/r0", "--yes", "--force", "--reason", "bad host")
    assert code == Exit.OK and "with force it drains" in out
    [forced] = fleet.client("look").get("/v1/actions").json()
    assert forced["kind"] == "drain" and forced["reason"] == "bad host"


def test_roles_and_missing_targets_have_their_own_exit_codes(fleet: Fleet) -> None:
    three(fleet)
    code, _, err = cli(fleet, "look", "restart", "gpu-a/r0", "--yes")
    assert code == Exit.AUTH and "not allowed: an operator token is needed (this one is viewer)" in err
    assert cli(fleet, "nope", "status")[0] == Exit.AUTH
    code, _, err = cli(fleet, "ops", "restart", "gpu-a/zz", "--dry-run")
    assert code == Exit.NOT_FOUND and "no replica 'zz'" in err
    assert cli(fleet, "ops", "cordon", "gpu-a/x")[0] == Exit.USAGE
    assert cli(fleet, "ops", "restart", "--bogus")[0] == Exit.USAGE
    code, out, _ = cli(fleet, "ops", "cordon", "gpu-a/0", "--dry-run")
    assert code == Exit.OK and "fences GPU 0 of gpu-a and drains 3 replicas" in out


def test_actions_follow_prints_each_change_once(fleet: Fleet) -> None:
    three(fleet)
    cli(fleet, "ops", "rollout", "tiny-llama", "--yes")
    out = io.StringIO()
    args = ops.parser("actions", "").parse_args([])
    args.follow, args.limit, args.state, args.every = True, 20, None, 0.0
    steps = iter([lambda: fleet.reconcile(), lambda: None])
    ops.actions(fleet.client("look"), Io(out=out, sleep=lambda _: next(steps)()), args, polls=2)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, "nothing changed: nothing printed twice"
    assert lines[0].endswith("running [0 of 3 done, rolling]")


def test_silences_are_added_listed_and_expired(fleet: Fleet) -> None:
    code, _, err = cli(fleet, "ops", "silence", "add", 'node="gpu-a"')
    assert code == Exit.USAGE and "--comment" in err
    code, out, _ = cli(fleet, "ops", "silence", "add", 'node="gpu-a"', "--dry-run", "--comment", "x")
    assert code == Exit.OK and "would mute 0 firing alert(s) for 2h" in out
    code, out, _ = cli(fleet, "ops", "silence", "add", 'node="gpu-a"', "--for", "30m", "--comment", "reboot")
    assert code == Exit.OK and out.startswith("silence 1 active until")
    code, out, _ = cli(fleet, "look", "silence", "list")
    assert 'node="gpu-a"' in out and "reboot" in out
    assert cli(fleet, "ops", "silence", "expire", "1")[1].strip() == "silence 1 expired"
    assert cli(fleet, "look", "silence", "list")[1].strip() == "ID  STATE  MATCHERS  ENDS_AT  CREATED_BY  COMMENT"
    code, _, err = cli(fleet, "ops", "silence", "add", "node=~(", "--comment", "x")
    assert code == Exit.USAGE and "bad matcher" in err


def test_the_token_comes_from_the_environment_or_a_private_client_file(tmp_path: Path) -> None:
    config = tmp_path / "client.yaml"
    config.write_text("url: http://cp.example:8000/\ntoken: s3cret\n")
    config.chmod(0o600)
    assert resolve(None, {ENV_CONFIG: str(config)}) == resolve("http://cp.example:8000", {ENV_CONFIG: str(config)})
    assert resolve(None, {ENV_CONFIG: str(config)}).token == "s3cret"
    assert resolve(None, {ENV_CONFIG: str(config), ENV_TOKEN: "env", ENV_URL: "http://x"}).token == "env"
    config.chmod(0o644)
    with pytest.raises(Exception, match="chmod 600"):
        resolve(None, {ENV_CONFIG: str(config)})


@pytest.mark.slow
def test_the_installed_command_says_when_the_control_plane_is_away(tmp_path: Path) -> None:
    env = {**os.environ, ENV_URL: "http://127.0.0.1:9", ENV_TOKEN: "t", ENV_CONFIG: str(tmp_path / "none.yaml")}
    done = subprocess.run([sys.executable, "-m", "pitstop.cli", "status"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == Exit.UNREACHABLE
    assert "cannot reach the control plane at http://127.0.0.1:9" in done.stderr and "t" not in done.stdout
