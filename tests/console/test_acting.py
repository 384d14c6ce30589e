"""Acting from the console: every button previews what the guardrails would decide, asks for confirmation,
then calls the API with the signed-in person's token; a refusal shows the control plane's own reason."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from bench.harness.http import probe
from tests.console.fleets import healthy, trouble
from tests.console.served import OPERATOR, buttons, choose_replica, click, open_console, serve, texts
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
        choose_replica(at.switch_page("views/replicas.py").run())
        click(at, "Restart")
        # Before anything happens: the guardrails' verdict and the blast radius, from the API's dry run.
        assert [i.value for i in at.info] == ["restarts 1 of 2 READY replicas of tiny-llama; 1 stay serving"]
        assert "guardrails: allowed" in texts(at) and "replicas it stops or restarts: gpu-a/r0" in texts(at)
        assert probe.get(f"{url}/v1/actions", headers=OPERATOR).json() == []  # a preview records nothing
        click(at, "Confirm: restart")
        [done] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
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
        other = probe.post(f"{url}/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=ADMIN)
        assert other.status_code == 201
        click(at, "Confirm: rolling restart of tiny-llama")
        again = probe.post(f"{url}/v1/models/tiny-llama/actions", json={"kind": "rolling_restart"}, headers=ADMIN)
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
        assert probe.get(f"{url}/v1/actions", headers=OPERATOR).json() == []
        click(at, "Confirm: set --max-num-seqs 32 on tiny-llama")
        [done] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
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
        assert probe.get(f"{url}/v1/actions", headers=OPERATOR).json() == []  # cancelled: nothing sent
        click(at, "Cordon GPU 0 of gpu-a")
        click(at, "Confirm: cordon gpu 0 of gpu-a")
        [cordon] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert cordon["kind"] == "cordon" and cordon["requested_by"] == "config:operator-0"
        assert at.success and f"action #{cordon['id']} cordon" in at.success[0].value


def test_silence_an_alert_from_its_labels_then_expire_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = trouble()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/alerts.py")
        chosen = at.selectbox(key="alert_detail").value
        at.text_input(key=f"silence_comment_{chosen}").input("looking at it")
        click(at, "Create silence")
        [silence] = probe.get(f"{url}/v1/silences", headers=OPERATOR).json()
        assert silence["created_by"] == "config:operator-0" and silence["comment"] == "looking at it"
        alert = probe.get(f"{url}/v1/alerts/{chosen}", headers=OPERATOR).json()
        assert alert["silenced_by"] == [silence["id"]]  # the prefilled matchers match the alert
        at.run()
        click(at, f"Expire silence #{silence['id']}")
        click(at, f"Confirm: expire silence #{silence['id']}")
        expired = probe.get(f"{url}/v1/silences/{silence['id']}", headers=OPERATOR).json()
        assert expired["state"] == "expired" and expired["expired_by"] == "config:operator-0"


def test_an_empty_comment_is_refused_with_the_apis_words(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = trouble()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/alerts.py")
        click(at, "Create silence")
        assert [e.value for e in at.error] == [
            "refused by the control plane (HTTP 422): comment: String should have at least 1 character"]
        assert probe.get(f"{url}/v1/silences", headers=OPERATOR).json() == []


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
        assert at.success, texts(at)  # the control plane's answer, as the page shows it (an error says why)
        breaker = probe.get(f"{url}/v1/remediation/breaker", headers=OPERATOR).json()
        assert not breaker["tripped"] and breaker["reset_by"] == "config:operator-0"
        at.run()
        assert not at.error and "Automation running, circuit breaker closed." in texts(at)


def _press(at: AppTest, key: str) -> AppTest:
    """Click the button of ``key``: several proposals each have an "Approve" of their own."""
    at.button(key=key).click().run()
    assert not at.exception, at.exception
    return at


def _audit(url: str, what: str) -> list[dict[str, object]]:
    entries: list[dict[str, object]] = probe.get(f"{url}/v1/audit", headers=ADMIN).json()
    return [e for e in entries if e["what"] == what]


def test_drain_a_replica_as_themself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/replicas.py")
        click(at, "Drain")
        assert "guardrails: allowed" in texts(at) and "replicas it stops or restarts: gpu-a/r0" in texts(at)
        assert probe.get(f"{url}/v1/actions", headers=OPERATOR).json() == []
        click(at, "Confirm: drain")
        [done] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert (done["kind"], done["target"], done["requested_by"]) == ("drain", "replica:gpu-a/r0",
                                                                         "config:operator-0")
        assert [s.value for s in at.success] == [f"action #{done['id']} drain replica:gpu-a/r0: {done['state']}"]
        [entry] = _audit(url, "action.drain")
        assert entry["actor"] == "config:operator-0" and entry["target"] == "replica:gpu-a/r0"


def _two_proposals(tmp_path: Path) -> tuple[list[SimAgent], Callable[[Fleet], None], dict[str, object]]:
    """Two wedged replicas of four, each restart proposed by a stall policy that waits for a person."""
    agent = SimAgent("gpu-a", [SimReplica(f"r{i}") for i in range(4)])

    def build(f: Fleet) -> None:
        f.run(30)
        wedge(agent, "r0")
        wedge(agent, "r1")
        f.run(60)

    policies = policy_dir(tmp_path, stall=STALL % ", require_approval: true")
    return [agent], build, {"policy_dirs": [str(policies)]}


def test_approve_one_proposal_and_reject_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build, settings = _two_proposals(tmp_path)
    with serve(tmp_path, agents, build, **settings) as url:
        proposed = probe.get(f"{url}/v1/actions", params={"state": "proposed"}, headers=OPERATOR).json()
        targets = {a["id"]: a["target"] for a in proposed}
        first, second = sorted(targets)
        at = open_console(monkeypatch, url, "op", page="views/actions.py")
        assert buttons(at).count("Approve") == 2 and buttons(at).count("Reject") == 2
        _press(at, f"ask:approve:{first}")
        assert f"Pitstop applies restart on {targets[first]} now, recorded as approved by you." in texts(at)
        assert probe.get(f"{url}/v1/actions/{first}", headers=OPERATOR).json()["state"] == "proposed"
        _press(at, f"yes:approve:{first}")
        approved = probe.get(f"{url}/v1/actions/{first}", headers=OPERATOR).json()
        assert approved["state"] == "running" and approved["approved_by"] == "config:operator-0"
        assert f"action #{first} restart {targets[first]}: running" in [s.value for s in at.success]
        at.run()  # the approved one no longer waits; the other still does
        assert buttons(at).count("Approve") == 1
        _press(at, f"ask:reject:{second}")
        assert "The proposal is closed and nothing is done." in texts(at)
        _press(at, f"yes:reject:{second}")
        rejected = probe.get(f"{url}/v1/actions/{second}", headers=OPERATOR).json()
        assert rejected["state"] == "rejected" and rejected["approved_by"] == "config:operator-0"
        assert rejected["outcome"] == "rejected by config:operator-0"
        assert [e["target"] for e in _audit(url, "action.approve")] == [f"action:{first}"]
        assert [(e["target"], e["actor"]) for e in _audit(url, "action.reject")] == [
            (f"action:{second}", "config:operator-0")]
        at.run()
        assert "Approve" not in buttons(at) and "Waiting for approval" not in texts(at)


def test_uncordon_a_gpu_from_its_tile_after_cordoning_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/nodes.py")
        click(at, "Cordon GPU 0 of gpu-a")
        click(at, "Confirm: cordon gpu 0 of gpu-a")
        assert probe.get(f"{url}/v1/nodes/gpu-a", headers=OPERATOR).json()["cordoned_gpus"] == [0]
        at.run()
        # The button follows the control plane's fence at once; the tile says the agent has yet to apply it.
        assert "Uncordon GPU 0 of gpu-a" in buttons(at) and "Cordon GPU 0 of gpu-a" not in buttons(at)
        assert "CORDONED: its replicas drain once the agent applies it" in texts(at)
        click(at, "Uncordon GPU 0 of gpu-a")
        click(at, "Confirm: uncordon gpu 0 of gpu-a")
        uncordon, cordon = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert (uncordon["kind"], cordon["kind"]) == ("uncordon", "cordon")
        assert uncordon["requested_by"] == "config:operator-0" and uncordon["params"]["gpu"] == 0
        assert [e["actor"] for e in _audit(url, "action.uncordon")] == ["config:operator-0"]
        at.run()
        assert "Cordon GPU 0 of gpu-a" in buttons(at) and "Uncordon GPU 0 of gpu-a" not in buttons(at)
        assert probe.get(f"{url}/v1/nodes/gpu-a", headers=OPERATOR).json()["cordoned_gpus"] == []


def test_cordon_then_uncordon_a_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build = healthy()
    with serve(tmp_path, agents, build) as url:
        at = open_console(monkeypatch, url, "op", page="views/nodes.py")
        click(at, "Cordon node gpu-a")
        click(at, "Confirm: cordon node gpu-a")
        [cordon] = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert (cordon["kind"], cordon["target"], cordon["requested_by"]) == ("cordon", "node:gpu-a",
                                                                             "config:operator-0")
        at.run()
        assert ":orange-badge[cordoned]" in texts(at) and "Uncordon node gpu-a" in buttons(at)
        click(at, "Uncordon node gpu-a")
        click(at, "Confirm: uncordon node gpu-a")
        uncordon, _ = probe.get(f"{url}/v1/actions", headers=OPERATOR).json()
        assert (uncordon["kind"], uncordon["target"], uncordon["requested_by"]) == ("uncordon", "node:gpu-a",
                                                                                   "config:operator-0")
        assert [e["target"] for e in _audit(url, "action.cordon") + _audit(url, "action.uncordon")] == [
            "node:gpu-a", "node:gpu-a"]
        at.run()
        assert "Cordon node gpu-a" in buttons(at) and not probe.get(f"{url}/v1/nodes/gpu-a",
                                                                     headers=OPERATOR).json()["cordoned"]


def test_a_viewer_sees_none_of_the_buttons_an_operator_sees(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agents, build, settings = _two_proposals(tmp_path)
    with serve(tmp_path, agents, build, **settings) as url:
        cordoned = probe.post(f"{url}/v1/nodes/gpu-a/actions", json={"kind": "cordon", "gpu": 0}, headers=ADMIN)
        assert cordoned.status_code == 201
        pages = {"views/replicas.py": ["Restart", "Drain"], "views/nodes.py": ["Cordon node gpu-a",
                                                                              "Uncordon GPU 0 of gpu-a"],
                 "views/actions.py": ["Approve", "Reject", "Approve", "Reject"]}
        for page, expected in pages.items():
            assert buttons(open_console(monkeypatch, url, "op", page=page)) == expected, page
            assert buttons(open_console(monkeypatch, url, "look", page=page)) == [], page
