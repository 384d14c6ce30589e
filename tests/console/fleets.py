"""Three fleets the console is opened on: none yet, a healthy one, and one in trouble."""

from __future__ import annotations

from collections.abc import Callable

from agent.wire import ReplicaEvent, ReplicaState
from tests.remediation.fleet import Fleet, SimAgent, SimReplica

Build = Callable[[Fleet], None]


def empty() -> tuple[list[SimAgent], Build | None]:
    return [], None


def healthy() -> tuple[list[SimAgent], Build]:
    """Two READY replicas whose agent reads every latency quantile; the trouble fleet's, like an older agent, only
    the p99."""
    quantiles = {"ttft_p50": 0.06, "ttft_p95": 0.1, "itl_p50": 0.012, "itl_p95": 0.017}
    agent = SimAgent("gpu-a", [SimReplica("r0", **quantiles), SimReplica("r1", **quantiles)])
    return [agent], lambda f: f.run(30)


def trouble() -> tuple[list[SimAgent], Build]:
    """r0 WEDGED (the stall policy restarts it), r1 far over its TTFT target (an alert fires), GPU 0 past slowdown."""
    agent = SimAgent("gpu-a", [SimReplica("r0"), SimReplica("r1"), SimReplica("r2")])

    def build(f: Fleet) -> None:
        f.run(30)
        wedged = agent.replica("r0")
        wedged.state, wedged.stalled, wedged.canary_ok, wedged.waiting = ReplicaState.WEDGED, True, False, 4
        agent.events.append(ReplicaEvent(replica="r0", at=f.clock(), kind="transition",
                                         from_state=ReplicaState.READY, to_state=ReplicaState.WEDGED,
                                         message="2 canaries failed and no token moved"))
        agent.replica("r1").ttft = 2.0
        agent.temperature = 90.0
        f.run(90)
    return [agent], build


FLEETS = {"empty": empty, "healthy": healthy, "trouble": trouble}
