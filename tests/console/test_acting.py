"""Acting from the console: every button previews what the guardrails would decide, asks for confirmation,
then calls the API with the signed-in person's token; a refusal shows the control plane's own reason."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from streamlit.testing.v1 import AppTest

from tests.console.fleets import healthy, trouble
from tests.console.served import OPERATOR, buttons, click, open_console, serve, texts
from tests.remediation.fleet import Fleet, SimAgent, SimReplica
from tests.remediation.test_guarded_flows import STALL, policy_dir, wedge

ADMIN = {"Authorization": "Bearer boss"}


def _sign_in(at: AppTest, token: str) -> AppTest:
    at.text_input(key="sign_in_token").input(token)
    next(b for b in at.button if b.label == "Sign in").click().run()
    assert not at.exception, at.exception
    return at


def test_an_operator_signs_in_and_restarts_a_replica_as_themself(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url)
        assert buttons(at) == ["Sign in"] and not at.dataframe  # nothing is read before signing in
        _sign_in(at, "op")
        assert [m.value for m in at.sidebar.markdown] == ["**config:operator-0 (operator)**"]
        assert not at.query_params  # the token never goes into the URL
        at.switch_page("views/replicas.py").run()
        click(at, "Restart")
        # Before anything happens: the guardrails' verdict and the blast radius, from the API's dry run.
        assert [i.value for i in at.info] == ["restarts 1 of 2 READY replicas of tiny-llama; 1 stay serving"]
        assert "guardrails: allowed" in texts(at) and "replicas it stops or restarts: gpu-a/r0" in texts(at)
        assert httpx.get(f"{url}/v1/actions", headers=OPERATOR).json() == []  # a preview records nothing
        click(at, "Confirm: restart")
        [done] = httpx.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert done["kind"] == "restart" and done["target"] == "replica:gpu-a/r0"
        assert done["requested_by"] == "config:operator-0" and done["state"] == "running"
        assert [s.value for s in at.success] == [f"action #{done['id']} restart replica:gpu-a/r0: running"]


def test_a_refused_action_shows_the_control_planes_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/fleet.py")
        click(at, "Rolling restart of tiny-llama")
        assert "guardrails: allowed" in texts(at)
        # Someone else starts one between the preview and the click.
        other = httpx.post(f"{url}/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=ADMIN)
        assert other.status_code == 201
        click(at, "Confirm: rolling restart of tiny-llama")
        again = httpx.post(f"{url}/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=ADMIN)
        assert again.status_code == 409
        assert [e.value for e in at.error] == [f"refused by the control plane (HTTP 409): {again.json()['detail']}"]
        # A new preview says so before any click.
        click(at, "Rolling restart of tiny-llama")
        assert f"(HTTP 409): {again.json()['detail']}" in at.error[0].value
        assert "Confirm: rolling restart of tiny-llama" not in buttons(at)


def test_set_max_num_seqs_of_a_model_as_a_canary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/fleet.py")
        at.number_input(key="mns-value:tiny-llama").set_value(32).run()
        click(at, "Set --max-num-seqs 32 on tiny-llama")
        assert any(i.value.startswith("tries --max-num-seqs 32 (now 64) on gpu-a/r0 first") for i in at.info)
        assert httpx.get(f"{url}/v1/actions", headers=OPERATOR).json() == []
        click(at, "Confirm: set --max-num-seqs 32 on tiny-llama")
        [done] = httpx.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert (done["kind"], done["target"], done["requested_by"]) == (
            "lower_max_num_seqs", "replica:gpu-a/r0", "config:operator-0")
        assert done["params"]["canary"] is True and done["params"]["max_num_seqs"] == 32


def test_cordon_a_gpu_then_its_tile_offers_uncordon(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/nodes.py")
        click(at, "Cordon GPU 0 of gpu-a")
        assert "replicas it stops or restarts: gpu-a/r0, gpu-a/r1" in texts(at)
        click(at, "Cancel")
        assert httpx.get(f"{url}/v1/actions", headers=OPERATOR).json() == []  # cancelled: nothing sent
        click(at, "Cordon GPU 0 of gpu-a")
        click(at, "Confirm: cordon gpu 0 of gpu-a")
        [cordon] = httpx.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert cordon["kind"] == "cordon" and cordon["requested_by"] == "config:operator-0"
        assert at.success and f"action #{cordon['id']} cordon" in at.success[0].value


def test_silence_an_alert_from_its_labels_then_expire_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = trouble()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/alerts.py")
        chosen = at.selectbox(key="alert_detail").value
        at.text_input(key=f"silence_comment_{chosen}").input("looking at it")
        click(at, "Create silence")
        [silence] = httpx.get(f"{url}/v1/silences", headers=OPERATOR).json()
        assert silence["created_by"] == "config:operator-0" and silence["comment"] == "looking at it"
        alert = httpx.get(f"{url}/v1/alerts/{chosen}", headers=OPERATOR).json()
        assert alert["silenced_by"] == [silence["id"]]  # the prefilled matchers match the alert
        at.run()
        click(at, f"Expire silence #{silence['id']}")
        click(at, f"Confirm: expire silence #{silence['id']}")
        expired = httpx.get(f"{url}/v1/silences/{silence['id']}", headers=OPERATOR).json()
        assert expired["state"] == "expired" and expired["expired_by"] == "config:operator-0"


def test_an_empty_comment_is_refused_with_the_apis_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = trouble()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/alerts.py")
        click(at, "Create silence")
        assert [e.value for e in at.error] == [
            "refused by the control plane (HTTP 422): comment: String should have at least 1 character"]
        assert httpx.get(f"{url}/v1/silences", headers=OPERATOR).json() == []


def test_reset_a_tripped_breaker_from_the_fleet_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent = SimAgent("gpu-a", [SimReplica(f"r{i}") for i in range(3)])
    policies = policy_dir(tmp_path, stall=STALL % "")

    def build(f: Fleet) -> None:
        f.run(30)
        wedge(agent, "r0")  # and the agent never manages to restart it: two failures trip the breaker
        f.run(200)

    with serve(tmp_path, [agent], build, policy_dirs=[str(policies)], action_deadline_seconds=30,
               guardrails={"breaker_max_failures": 2}) as url:
        at = open_console(monkeypatch, url, "op", page="views/fleet.py")
        assert at.error[0].value.startswith("Circuit breaker TRIPPED")
        click(at, "Reset the circuit breaker")
        assert "Automation resumes" in texts(at)
        click(at, "Confirm: reset the circuit breaker")
        breaker = httpx.get(f"{url}/v1/remediation/breaker", headers=OPERATOR).json()
        assert not breaker["tripped"] and breaker["reset_by"] == "config:operator-0"
        at.run()
        assert not at.error and "Automation running, circuit breaker closed." in texts(at)
