"""The agent's canaries: a short streaming completion to each READY replica, about every ``canary_interval``.

A canary runs beside the collector, never inside it: one to a wedged engine waits out its whole timeout, and
awaited in the collection pass it would hold back the node's GPU readings and every other replica's scrape
just when they matter. One round is in flight per replica at most.

A round goes with the replica's scrape, sent at the same moment: its "before" is the generation-token counter
that scrape reads, so a canary never waits on a slow /metrics. A canary that fails without a token is confirmed
by the next at once (``wedge_canaries`` in a row make the verdict), beside the counter read that judges the
first: readiness goes off within seconds of a wedge (``agent/progress.py``), whichever vLLM process froze:

- a frozen EngineCore: the API server answers /metrics at once and the counter stands still;
- a frozen API server: nothing answers, neither the canaries nor the reads. When the read begun with the round
  is still unanswered once its last canary failed (``wedge_canaries`` deadlines, 6 s at the defaults), the
  counter is not waited for: the engine has answered nothing for that long, to users either. A busy API server
  answers its /metrics within seconds and is judged on the counter as always. An API server that froze in the
  middle of a round (its first read answered, the later ones not) has each later read waited for that same span
  at most: unanswered, the counter is unreadable, and the verdict comes a span after the freeze, not a scrape
  timeout or two.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Mapping

import httpx

from agent.attached import AttachedReplica
from agent.config import AgentConfig
from agent.probes import CompletionResult, completion_request, generation_tokens, stream_completion
from agent.progress import CanaryEvidence
from agent.states import ReplicaState
from agent.supervisor import ReplicaSupervisor

Replica = ReplicaSupervisor | AttachedReplica

CANARY_STATES = frozenset({ReplicaState.READY, ReplicaState.ATTACHED})
# Four tokens: the canary goes through decode steps as well as a prefill, as users' requests do; the three more
# cost about 0.04 % of a core at the default intervals (bench/README.md).
CANARY_PROMPT, CANARY_TOKENS = "ping", 4
# Once a canary's first token is in, its other three (a few decode steps: ~5-30 ms) and [DONE] are read together
# after this long rather than each as it comes; a slower answer is read on as it arrives (bench/README.md).
CANARY_GATHER_SECONDS = 0.05


class Canaries:
    """When each replica's canary is due, and the canaries in flight.

    ``client`` is the lean loopback transport the scrapes use: through httpx's own, the canary and its /metrics
    read were most of the agent's CPU at a 1 s interval. ``metrics_urls``: each replica's scrape URL, for the
    generation-token counter read around a failed canary.
    """

    def __init__(self, config: AgentConfig, client: httpx.AsyncClient, metrics_urls: Mapping[str, str]) -> None:
        self.config = config
        self.client = client
        self.metrics_urls = metrics_urls
        self.in_flight: dict[str, asyncio.Task[None]] = {}
        self._scrapes_since: dict[str, int] = {}  # per replica, since its last canary started
        # Each replica's canary request, built once (the same bytes every interval) and again if its model changes.
        self._requests: dict[str, tuple[str, httpx.Request]] = {}

    def due(self, name: str) -> bool:
        """Whether this scrape of ``name`` sends its canary: ``canary_scrapes`` scrapes since its last one started
        (a replica that has had none yet: at once). Called once per scrape: it counts them."""
        every = self.config.canary_scrapes
        if every <= 0:
            return False
        since = self._scrapes_since.get(name)
        if since is not None:
            self._scrapes_since[name] = since + 1
        return since is None or since + 1 >= every

    def wanted(self, replica: Replica) -> bool:
        """Whether ``replica`` takes a canary now: it serves, and its last one has ended."""
        return replica.state in CANARY_STATES and replica.spec.name not in self.in_flight

    def start(self, replica: Replica, before: asyncio.Future[float | None] | float | None) -> None:
        """Send ``replica`` its canaries until a verdict, beside the caller. ``before``: the generation-token
        counter as the scrape sent with them reads it (a future: one /metrics read per engine per interval, and
        none waited for before the canary goes), a value read just before, or None: unknown."""
        name = replica.spec.name
        self._scrapes_since[name] = 0
        task = asyncio.create_task(self._until_verdict(replica, before), name=f"canary-{name}")
        self.in_flight[name] = task
        task.add_done_callback(functools.partial(self._done, name))

    def cancel(self) -> None:
        for task in list(self.in_flight.values()):
            task.cancel()

    def _done(self, name: str, _task: asyncio.Task[None]) -> None:
        self.in_flight.pop(name, None)

    def _read_timeout(self) -> float:
        """How long a counter read around a failed canary is waited for: as long as a verdict's canaries take
        (6 s at the defaults). Unanswered that long, it is the silence of a frozen API server, unreadable, as
        the round's own read is; waited out to the scrape's timeout, it held a verdict ten seconds and more."""
        return self.config.wedge_canaries * self.config.canary_timeout

    def _counter(self, replica: Replica) -> asyncio.Task[float | None]:
        """The engine's generation-token counter, read now, beside whatever runs."""
        return asyncio.create_task(generation_tokens(self.client, self.metrics_urls[replica.spec.name],
                                                     replica.model_name, self._read_timeout(),
                                                     replica.spec.adapter))

    async def _until_verdict(self, replica: Replica, before: asyncio.Future[float | None] | float | None) -> None:
        first, before_read = (before, before) if isinstance(before, asyncio.Future) else (None, _done_with(before))
        failed: list[tuple[CompletionResult, asyncio.Future[float | None], asyncio.Task[float | None]]] = []
        try:
            for _ in range(self.config.wedge_canaries):
                result = await self.send(replica)
                if replica.state not in CANARY_STATES:
                    return  # left READY meanwhile (a restart, a drain): the verdict is about an engine that is going
                if result.ok or result.ttft_seconds is not None:  # it answered, or streamed: progress either way
                    replica.canary_observed(CanaryEvidence(ok=result.ok, streamed=True, error=result.error))
                    return
                after = self._counter(replica)  # the next canary's "before" too; it goes at once, beside this read
                failed.append((result, before_read, after))
                before_read = after
            # As many canaries as a verdict needs failed without a token. An API server that has not answered even
            # the read begun with the first of them is not waited on any longer.
            silent = first is not None and not first.done()
            for result, before_at, after_at in failed:
                if silent:
                    evidence = CanaryEvidence(ok=False, error=result.error, silent=True)
                else:
                    # Without a "before" the counter cannot show progress: its "after" is not waited for.
                    tokens_before = await before_at
                    tokens_after = None if tokens_before is None else await after_at
                    evidence = CanaryEvidence(ok=False, tokens_before=tokens_before, tokens_after=tokens_after,
                                              error=result.error)
                replica.canary_observed(evidence)
            replica.progress.round_ended()
        finally:
            for _, _, after_at in failed:
                after_at.cancel()

    async def send(self, replica: Replica) -> CompletionResult:
        """One canary completion; the replica's last canary figures and its count of cut ones updated."""
        client, name = self.client, replica.spec.name
        model, request = self._requests.get(name, (None, None))
        if request is None or model != replica.model_name:
            request = completion_request(client, replica.spec.base_url, replica.model_name, CANARY_PROMPT,
                                         CANARY_TOKENS, self.config.canary_timeout)
            self._requests[name] = (replica.model_name, request)
        result = await stream_completion(client, replica.spec.base_url, replica.model_name, CANARY_PROMPT,
                                         CANARY_TOKENS, self.config.canary_timeout, asyncio.get_running_loop().time,
                                         request=request, gather_seconds=CANARY_GATHER_SECONDS)
        replica.canary_ok, replica.canary_ttft = result.ok, result.ttft_seconds
        if result.cut:
            replica.canary_aborts_total += 1  # the agent's own abort, never a user's error (``agent.scrape``)
        if not result.ok:
            replica.machine.note("canary", f"canary failed: {result.error}")
        return result


def _done_with(value: float | None) -> asyncio.Future[float | None]:
    future: asyncio.Future[float | None] = asyncio.get_running_loop().create_future()
    future.set_result(value)
    return future
