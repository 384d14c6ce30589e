"""What a desired state means per replica (pure), its copy on disk, and the reporter's HTTP exchange."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from agent.desired import DesiredStore, Want, plan_wants
from agent.reporter import Reporter, ReportError, report_retry_delay
from agent.wire import PROTOCOL_VERSION, DesiredState, GpuSample, NodeReport, ReplicaSpec


def desired(*specs: ReplicaSpec) -> DesiredState:
    return DesiredState(node="n1", replicas=list(specs))


def test_higher_generation_is_a_new_want_lower_is_stale() -> None:
    current = {"a": Want(True, 2, ["--max-num-seqs", "64"]), "b": Want(True, 5, [])}
    plan = plan_wants(desired(ReplicaSpec(name="a", generation=3, engine_args=["--max-num-seqs", "32"]),
                              ReplicaSpec(name="b", generation=4, engine_args=["--x"]),
                              ReplicaSpec(name="ghost", generation=9)), current)
    assert plan == {"a": Want(True, 3, ["--max-num-seqs", "32"])}


def test_same_generation_disabled_means_stop_keeping_args() -> None:
    current = {"a": Want(True, 2, ["--y"])}
    assert plan_wants(desired(ReplicaSpec(name="a", generation=2, enabled=False)), current) == {
        "a": Want(False, 2, ["--y"])}
    assert plan_wants(desired(ReplicaSpec(name="a", generation=2, engine_args=["--y"])), current) == {}
    assert plan_wants(desired(), current) == {}  # empty list: keep running the config


def test_a_capturing_generation_asks_for_a_dump_and_an_old_agents_answer_asks_none() -> None:
    current = {"a": Want(True, 2, ["--y"])}
    plan = plan_wants(desired(ReplicaSpec(name="a", generation=3, engine_args=["--y"], capture_stack=True)), current)
    assert plan == {"a": Want(True, 3, ["--y"], capture_stack=True)}
    old = DesiredState.model_validate({"node": "n1", "replicas": [{"name": "a", "generation": 3}]})
    assert plan_wants(old, current)["a"].capture_stack is False
    assert old.cordoned_gpus == []


def test_fields_added_after_protocol_1_stay_off_the_wire_until_used() -> None:
    # Both sides forbid unknown fields: an agent or control plane that predates these must still read us.
    plain = desired(ReplicaSpec(name="a", generation=1)).model_dump(mode="json")
    assert "cordoned_gpus" not in plain and "capture_stack" not in plain["replicas"][0]
    assert "cordoned" not in GpuSample(index=0, uuid="GPU-0", name="H200").model_dump_json()
    used = DesiredState(node="n1", cordoned_gpus=[2], replicas=[ReplicaSpec(name="a", generation=1,
                                                                             capture_stack=True)])
    assert DesiredState.model_validate_json(used.model_dump_json()) == used
    fenced = GpuSample(index=0, uuid="u", name="n", cordoned=True)
    assert GpuSample.model_validate_json(fenced.model_dump_json()).cordoned


def test_store_round_trips_and_ignores_a_corrupt_file(tmp_path: Path) -> None:
    store = DesiredStore(tmp_path / "state")
    assert store.load() is None
    state = desired(ReplicaSpec(name="a", generation=7, engine_args=["--z"]))
    store.save(state)
    assert store.load() == state
    store.path.write_text("{not json")
    assert store.load() is None


def report() -> NodeReport:
    return NodeReport(protocol_version=PROTOCOL_VERSION, node="n1", hostname="h", agent_version="0",
                      sent_at=datetime(2026, 1, 1, tzinfo=UTC), sequence=4)


def test_reporter_posts_with_bearer_token_and_reads_desired_state() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json={"node": "n1", "replicas": [{"name": "a", "generation": 1}]})

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    answer = asyncio.run(Reporter(client, "http://cp:8000/", "n1", token="t0k").send(report()))
    assert answer.replicas[0].generation == 1
    assert str(seen[0].url) == "http://cp:8000/v1/agents/n1/report"
    assert seen[0].headers["authorization"] == "Bearer t0k"
    assert json.loads(seen[0].content)["sequence"] == 4


@pytest.mark.parametrize("response", [httpx.Response(503, text="down"), httpx.Response(200, text="<html>"),
                                      httpx.ConnectError("refused")])
def test_reporter_failures_are_report_errors(response: httpx.Response | Exception) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(response, Exception):
            raise response
        return response

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    with pytest.raises(ReportError):
        asyncio.run(Reporter(client, "http://cp", "n1").send(report()))


def test_retry_delay_doubles_and_is_bounded() -> None:
    assert [report_retry_delay(n, 5.0) for n in (1, 2, 3, 4, 5, 10)] == [5, 10, 20, 40, 60, 60]


def test_retries_are_jittered_over_the_backoff_and_never_sooner_than_retry_after() -> None:
    import random

    from agent.reporter import next_attempt_in

    rng = random.Random(7)
    waits = [next_attempt_in(3, 5.0, None, rng) for _ in range(200)]
    assert all(0 <= w <= 20 for w in waits)  # full jitter over the third failure's 20 s
    assert max(waits) - min(waits) > 10  # spread out: a fleet that failed together does not retry together
    assert all(next_attempt_in(1, 5.0, 30.0, rng) >= 30.0 for _ in range(50))  # the control plane asked for 30 s
    assert next_attempt_in(1, 5.0, 3600.0, rng) == 60.0  # but cannot silence an agent past its own cap


def test_an_agent_backs_off_to_four_report_intervals_so_its_node_is_current_soon_after_an_outage() -> None:
    import random

    from agent.retry import report_retry_cap, report_wait

    # The control plane calls a node stale after 30 s: at 5 s an agent never waits past 20 s, whatever the outage.
    assert [report_retry_cap(i) for i in (0.5, 1.0, 5.0, 15.0, 60.0)] == [10.0, 10.0, 20.0, 60.0, 60.0]
    rng = random.Random(3)
    waits = [report_wait(n, 5.0, None, rng) for n in (8, 12, 16) for _ in range(100)]
    assert all(0 <= w <= 20 for w in waits) and max(waits) > 15  # spread over the whole 20 s, not bunched
    assert all(report_wait(1, 5.0, 3600.0, rng) == 20.0 for _ in range(5))  # Retry-After up to the cap


def test_agents_told_the_same_retry_after_do_not_come_back_together() -> None:
    import random

    from agent.reporter import next_attempt_in

    rng = random.Random(11)
    waits = [next_attempt_in(2, 5.0, 5.0, rng) for _ in range(200)]  # a restarted control plane's "5 s"
    assert all(5.0 <= w <= 10.0 for w in waits), "never sooner than asked, at most one interval later"
    assert max(waits) - min(waits) > 4.0


@pytest.mark.parametrize(("header", "seconds"), [
    ("7", 7.0), (" 12 ", 12.0), ("Sun, 29 Nov 2026 12:00:30 GMT", 30.0), ("Sun, 29 Nov 2026 11:00:00 GMT", 0.0),
    ("soon", None), (None, None)])
def test_retry_after_reads_seconds_and_http_dates(header: str | None, seconds: float | None) -> None:
    from datetime import UTC, datetime

    from agent.reporter import retry_after_seconds

    assert retry_after_seconds(header, datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)) == seconds


def test_a_busy_control_planes_retry_after_reaches_the_retry() -> None:
    def handler(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(503, headers={"Retry-After": "4"}, text="report backlog full")

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    with pytest.raises(ReportError) as raised:
        asyncio.run(Reporter(client, "http://cp", "n1").send(report()))
    assert raised.value.retry_after == 4.0
