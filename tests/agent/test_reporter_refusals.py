"""What the agent makes of a control plane's refusal: which it was, what to check, logged once per outage."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from agent.config import AgentConfig
from agent.gpu.sim import SimGpuBackend
from agent.node import Agent
from agent.reporter import Reporter, ReportError, settled
from agent.wire import PROTOCOL_VERSION, NodeReport, ReplicaEvent, ReplicaState, ReplicaStatus

NOW = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
CP = "http://cp.example:8000"


def report(**changes: Any) -> NodeReport:
    return NodeReport(protocol_version=PROTOCOL_VERSION, node="n1", hostname="h", agent_version="0", sent_at=NOW,
                      sequence=4, **changes)


def refusal(response: httpx.Response | Exception, token: str | None = "t0k") -> ReportError:
    def handler(_request: httpx.Request) -> httpx.Response:
        if isinstance(response, Exception):
            raise response
        return response

    async def send() -> ReportError:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            with pytest.raises(ReportError) as raised:
                await Reporter(client, CP, "n1", token=token).send(report())
            return raised.value

    return asyncio.run(send())


def test_a_refused_token_is_named_as_such_not_as_an_unreachable_control_plane() -> None:
    forbidden = refusal(httpx.Response(403, json={"detail": "token not accepted"}))
    assert forbidden.kind == "token" and forbidden.status == 403
    assert forbidden.summary.startswith(f"control plane {CP} refused this agent's token (HTTP 403: token not accepted)")
    assert "check `token` (PITSTOP_AGENT_TOKEN)" in forbidden.summary and "unreachable" not in forbidden.summary
    bound = refusal(httpx.Response(403, json={"detail": "this agent token may only report as node gpu-b"}))
    assert "only report as node gpu-b" in bound.summary and "(this agent is n1)" in bound.summary
    missing = refusal(httpx.Response(401, json={"detail": "token required (Authorization: Bearer ...)"}), token=None)
    assert missing.kind == "token" and f"control plane {CP} wants a token (HTTP 401" in missing.summary
    dropped = refusal(httpx.Response(401, json={"detail": "token required"}))
    assert "did not receive this agent's token" in dropped.summary  # one is configured: something drops the header
    assert refusal(httpx.ConnectError("refused")).summary == "control plane unreachable (ConnectError: refused)"


def test_a_refusal_for_the_hosts_clock_says_so_and_keeps_the_xids() -> None:
    problem = {"type": "clock_skew", "loc": ["sent_at"], "ctx": {"skew_seconds": -600.0},
               "msg": "sent_at is 600 s behind the control plane's clock; at most 300 s of clock skew is accepted"}
    skewed = refusal(httpx.Response(422, json={"detail": [problem]}))
    assert skewed.kind == "clock" and not skewed.refused_content  # nothing the report says is wrong
    assert skewed.summary == (f"control plane {CP} refused the report for this host's clock: sent_at: sent_at is 600 s "
                              "behind the control plane's clock; at most 300 s of clock skew is accepted")
    malformed = refusal(httpx.Response(422, json={"detail": [{"type": "greater_than_equal", "msg": "too small",
                                                              "loc": ["gpus", 0, "xids", 0]}]}))
    assert malformed.kind == "refused" and malformed.refused_content
    assert malformed.summary.endswith("refused the report (HTTP 422): gpus.0.xids.0: too small")


def test_a_409_without_the_control_planes_account_changes_no_sequence() -> None:
    from_a_proxy = refusal(httpx.Response(409, text="conflict"))
    assert from_a_proxy.out_of_order is None and from_a_proxy.sequence_past(7) == 7
    assert from_a_proxy.kind == "refused"
    told = refusal(httpx.Response(409, json={"detail": {
        "reason": "out_of_order", "message": "...", "sequence": 4, "sent_at": NOW.isoformat(),
        "last_sequence": 2**63 - 1, "last_sent_at": NOW.isoformat(), "said_by_a_newer_control_plane": True}}))
    assert told.kind == "out_of_order"
    assert told.sequence_past(7) == 2**63 - 2  # the next report still fits the wire


def test_times_recorded_before_the_clock_stepped_back_are_sent_as_the_reports_own() -> None:
    later = NOW + timedelta(minutes=10)
    status = ReplicaStatus(name="r0", model="m", url="http://127.0.0.1:9001", state=ReplicaState.READY, ready=True,
                           state_since=later)
    event = ReplicaEvent(replica="r0", at=later, kind="transition", to_state=ReplicaState.READY)
    sent = settled(report(replicas=[status], events=[event]))
    assert sent.replicas[0].state_since == NOW and sent.events[0].at == NOW
    plain = report()
    assert settled(plain) is plain
    seen: list[dict[str, Any]] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(200, json={"node": "n1"})

    async def send() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await Reporter(client, CP, "n1").send(report(replicas=[status], events=[event]))

    asyncio.run(send())
    assert datetime.fromisoformat(seen[0]["replicas"][0]["state_since"]) == NOW


def forbidden() -> httpx.Response:
    return httpx.Response(403, json={"detail": "token not accepted"})


def unreachable() -> httpx.Response:
    raise httpx.ConnectError("refused")


def test_the_report_loop_logs_each_cause_once_per_outage(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    answers: list[Callable[[], httpx.Response]] = [
        forbidden, forbidden, forbidden, unreachable, unreachable, lambda: httpx.Response(200, json={"node": "n1"})]
    config = AgentConfig.model_validate({"node": "n1", "control_plane": None, "gpu_backend": "sim",
                                         "sim_gpu_count": 0, "report_interval": 0.01,
                                         "state_dir": str(tmp_path / "state")})

    async def scenario() -> None:
        stop = asyncio.Event()

        def handler(_request: httpx.Request) -> httpx.Response:
            answer = answers.pop(0)()
            if not answers:
                stop.set()
            return answer

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            agent = Agent(config, client, SimGpuBackend(tmp_path / "gpus", 0))
            agent.reporter = Reporter(client, CP, "n1", token="t0k")
            await asyncio.wait_for(agent._report_loop(stop), timeout=30)

    with caplog.at_level(logging.INFO, logger="agent.node"):
        asyncio.run(scenario())
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "agent.node"]
    assert [level for level, _ in said] == ["WARNING", "WARNING", "INFO"], said
    assert said[0][1].startswith(f"control plane {CP} refused this agent's token (HTTP 403")
    assert said[0][1].endswith("; supervising on the last desired state; keeping a reading every report interval to "
                               "send when it answers")
    assert said[1][1].startswith("control plane unreachable (ConnectError: refused)")
    assert said[2][1] == "control plane reachable again after 5 failed reports"


def test_gpu_readings_no_gpu_can_give_are_sent_as_unknown_never_as_a_refused_report(tmp_path: Path) -> None:
    # A simulator file (as a broken sensor would read): 10^6 °C, a NaN power draw, memory past 64 bits, XID -1.
    (tmp_path / "gpu0-4242.json").write_text(json.dumps({
        "temperature_celsius": 1e6, "power_watts": float("nan"), "memory_used_bytes": 2**70,
        "xid_events": [{"code": -1, "at": "1"}, {"code": 79, "at": "2"}]}))
    [gpu] = SimGpuBackend(tmp_path, 1, pid_alive=lambda _pid: True).read().gpus
    assert gpu.temperature_celsius is None and gpu.memory_used_bytes is None
    assert gpu.power_watts is not None and 0 <= gpu.power_watts <= 10_000  # the idle figure: NaN is no reading
    assert gpu.xids == [79]
    sent = report(gpus=[gpu])
    assert NodeReport.model_validate_json(sent.model_dump_json()) == sent  # what the control plane reads back


def test_the_first_report_goes_out_once_the_readiness_endpoint_listens(tmp_path: Path) -> None:
    """A restarted agent that adopts a READY engine must not say READY while no load balancer can check it:
    the control plane would take the next batch of a rollout out of rotation before this one is back."""
    config = AgentConfig.model_validate({"node": "n1", "control_plane": CP, "gpu_backend": "sim",
                                         "sim_gpu_count": 0, "report_interval": 60, "host": "127.0.0.1",
                                         "port": 0, "state_dir": str(tmp_path / "state")})
    answered: list[int] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        agent: Agent | None = None

        async def handler(request: httpx.Request) -> httpx.Response:
            assert agent is not None and agent.bound_port is not None, "a report before the API listened"
            async with httpx.AsyncClient() as probe:
                answered.append((await probe.get(f"http://127.0.0.1:{agent.bound_port}/healthz")).status_code)
            stop.set()
            return httpx.Response(200, json={"node": "n1"})

        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            agent = Agent(config, client, SimGpuBackend(tmp_path / "gpus", 0))
            await asyncio.wait_for(agent.run(stop), timeout=30)

    asyncio.run(scenario())
    assert answered == [200]
