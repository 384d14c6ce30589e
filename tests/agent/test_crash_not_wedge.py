"""An engine killed while READY is a crash (READY -> BACKOFF), even when the canary sees it die first.

A dead engine refuses the canary's connection at once, and the agent reaps its exit a moment later: in that
moment two flat canary failures are a WEDGED verdict. Reported as a wedge, the killed engine's trail read
READY -> WEDGED -> BACKOFF, and a real vLLM killed with -9 was once reported that way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import httpx
import psutil

from agent.config import BackoffConfig, ReplicaConfig, WarmupConfig
from agent.progress import CanaryEvidence
from agent.supervisor import ReplicaSupervisor
from agent.wire import ReplicaState as S
from tests.helpers import free_port

REFUSED = CanaryEvidence(ok=False, error="connection refused")  # what a canary of a dead engine reads


def _exited(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _block_until_exited(pid: int) -> None:
    """Block (on purpose: the event loop must not run) until ``pid`` has exited, reaping nothing."""
    with contextlib.suppress(ChildProcessError):  # the child watcher reaped it already
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert _exited(pid)


def test_canaries_refused_by_a_killed_engine_do_not_make_it_wedged(tmp_path: Path) -> None:
    spec = ReplicaConfig(name="k", model="tiny", port=free_port(), start_timeout=30, stop_timeout=5,
                         warmup=WarmupConfig(requests=1, max_tokens=2), args=["--sim-startup-seconds", "0.2"],
                         env={"PITSTOP_SIM_GPU_DIR": str(tmp_path / "simgpu")})

    async def scenario() -> list[tuple[S | None, S | None]]:
        async with httpx.AsyncClient() as client:
            sup = ReplicaSupervisor(spec, client, tmp_path / "state", BackoffConfig(base=30, cap=30),
                                    poll_interval=0.1)
            task = asyncio.create_task(sup.run())
            try:
                for _ in range(300):
                    if sup.state == S.READY:
                        break
                    await asyncio.sleep(0.1)
                assert sup.state == S.READY
                assert sup.proc is not None
                pid = sup.proc.pid
                os.kill(pid, signal.SIGKILL)
                # No await until both canaries are judged: the event loop cannot have handled the exit yet.
                _block_until_exited(pid)
                sup.canary_observed(REFUSED)
                sup.canary_observed(REFUSED)
                for _ in range(100):
                    if sup.state == S.BACKOFF:
                        break
                    await asyncio.sleep(0.1)
                return [(e.from_state, e.to_state) for e in sup.machine.drain_events() if e.kind == "transition"]
            finally:
                sup.request_shutdown()
                await asyncio.wait_for(task, 30)

    transitions = asyncio.run(scenario())
    assert (S.READY, S.BACKOFF) in transitions, transitions
    assert all(S.WEDGED not in t for t in transitions), transitions


def test_an_engine_killed_during_its_warmup_is_reported_killed_not_only_as_a_failed_request(tmp_path: Path) -> None:
    """The kernel's OOM killer ends an engine with SIGKILL; the warmup request it was answering fails a moment
    before the agent reaps the exit. The reason on BACKOFF must say the engine was killed, not only that a
    request failed."""
    spec = ReplicaConfig(name="w", model="tiny", port=free_port(), start_timeout=30, stop_timeout=5,
                         warmup=WarmupConfig(requests=1, max_tokens=2), args=["--sim-startup-seconds", "0.2"],
                         env={"PITSTOP_SIM_GPU_DIR": str(tmp_path / "simgpu")})
    engine: list[int] = []

    async def scenario() -> list[str]:
        async with httpx.AsyncClient() as real:
            async def handle(request: httpx.Request) -> httpx.Response:
                if request.url.path == "/v1/completions":  # the warmup: the engine dies under it
                    os.kill(engine[0], signal.SIGKILL)
                    _block_until_exited(engine[0])
                    raise httpx.ReadError("connection reset by peer", request=request)
                answer = await real.send(real.build_request(request.method, request.url, headers=request.headers,
                                                            content=request.content))
                headers = {k: v for k, v in answer.headers.items()
                           if k.lower() not in ("content-length", "content-encoding", "transfer-encoding")}
                return httpx.Response(answer.status_code, headers=headers, content=answer.content)

            async with httpx.AsyncClient(transport=httpx.MockTransport(handle)) as client:
                sup = ReplicaSupervisor(spec, client, tmp_path / "state", BackoffConfig(base=30, cap=30),
                                        poll_interval=0.1)
                task = asyncio.create_task(sup.run())
                try:
                    for _ in range(300):
                        if sup.proc is not None:
                            engine[:] = [sup.proc.pid]
                        if sup.state == S.BACKOFF:
                            break
                        await asyncio.sleep(0.05)
                    return [e.message for e in sup.machine.drain_events()
                            if e.kind == "transition" and e.to_state == S.BACKOFF]
                finally:
                    sup.request_shutdown()
                    await asyncio.wait_for(task, 30)

    reasons = asyncio.run(scenario())
    assert len(reasons) == 1 and "killed by SIGKILL" in reasons[0], reasons
