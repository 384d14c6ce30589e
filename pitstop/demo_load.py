"""The demo's load: streaming chat clients behind a small balancer that follows the agent's readiness.

``python -m pitstop.demo_load`` runs until SIGTERM/SIGINT. The balancer polls the agent's ``/v1/replicas``
every half second, as a load balancer's health check polls ``/v1/replicas/<name>/ready``, and sends each
request to the READY replica with the fewest requests in flight. Requests a replica holds when the agent
judges it WEDGED are cut (HAProxy's ``on-marked-down shutdown-sessions``): a wedged engine never answers them.
A client retries a request whose connection broke before its answer completed (cut by the balancer, refused,
reset) on another replica, up to ``MAX_ATTEMPTS`` times; an engine's error answer is not retried. Every
attempt that failed is counted by reason, and a request counts as failed once it failed for good: nothing is
dropped from the figures. They are written to ``--stats`` (JSON) every second and at the end.

From ``--surge-after`` seconds on the fault clock (``--clock-file``, the unix time the demo's faults count
from), ``--surge-concurrency`` more clients run closed loop: the traffic half of the demo's latency surge.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import signal
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from enginesim.faults import read_clock_file
from enginesim.loadgen import RequestResult, prompt_text, stream_one

POLL_S = 0.5
MAX_ATTEMPTS = 3
NO_REPLICA_WAIT_S = 30.0
FAILURE_PAUSE_S = 0.2
# Worth another replica: the answer never came, through no answer of the engine's.
RETRYABLE = frozenset({"wedged", "ConnectError", "ConnectTimeout", "RemoteProtocolError", "ReadError",
                       "stream_incomplete", "no_ready_replica"})


@dataclass
class Figures:
    """What the load saw; ``attempts_failed`` by reason, requests counted once, when they end."""

    requests_ok: int = 0
    requests_failed: int = 0
    requests_retried: int = 0
    attempts_failed: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    surge_started_at: float | None = None

    def as_json(self, in_flight: int) -> dict[str, object]:
        return {"requests_ok": self.requests_ok, "requests_failed": self.requests_failed,
                "requests_retried": self.requests_retried, "attempts_failed": dict(self.attempts_failed),
                "failures": dict(self.failures), "in_flight": in_flight,
                "surge_started_at": self.surge_started_at, "updated_at": time.time()}


class Balancer:
    """READY replicas from the agent, least requests in flight first; cuts what a WEDGED replica holds."""

    def __init__(self, client: httpx.AsyncClient, agent_url: str) -> None:
        self.client, self.agent_url = client, agent_url
        self.urls: dict[str, str] = {}
        self.ready: set[str] = set()
        self.held: dict[str, set[asyncio.Task[RequestResult]]] = {}

    async def poll(self) -> None:
        try:
            replicas = (await self.client.get(f"{self.agent_url}/v1/replicas", timeout=5)).json()
        except (httpx.HTTPError, ValueError):
            return  # the agent is busy: keep routing by the last answer, as a balancer keeps its last check
        self.urls = {r["name"]: r["url"] for r in replicas}
        self.ready = {r["name"] for r in replicas if r.get("ready")}
        for r in replicas:
            if r.get("state") == "WEDGED":
                for task in self.held.get(r["name"], set()):
                    task.cancel("wedged")

    async def run(self) -> None:
        while True:
            await self.poll()
            await asyncio.sleep(POLL_S)

    def pick(self, avoid: str | None) -> str | None:
        choices = sorted(self.ready, key=lambda n: (len(self.held.get(n, ())), n))
        preferred = [n for n in choices if n != avoid]
        return next(iter(preferred or choices), None)

    async def route(self, avoid: str | None) -> str | None:
        deadline = time.monotonic() + NO_REPLICA_WAIT_S
        # The ready set changes with the next poll: wait for it as a balancer with every server down does.
        while (name := self.pick(avoid)) is None and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(POLL_S / 2)
        return name


async def one_request(balancer: Balancer, model: str, n: int, max_tokens: int, figures: Figures) -> bool:
    """One request, retried on another replica when its connection broke; True when it completed."""
    last: str | None = None
    reason = "unknown"
    for attempt in range(MAX_ATTEMPTS):
        name = await balancer.route(last)
        if name is None:
            reason = "no_ready_replica"
        else:
            result = RequestResult(ok=False)
            task = asyncio.create_task(stream_one(balancer.client, balancer.urls[name], model,
                                                  prompt_text(n, 256), max_tokens, 120.0, result))
            held = balancer.held.setdefault(name, set())
            held.add(task)
            try:
                await asyncio.wait([task])
            finally:
                held.discard(task)
                task.cancel()
            if task.cancelled():
                reason = "wedged"
            elif result.ok:
                figures.requests_ok += 1
                if attempt:
                    figures.requests_retried += 1
                return True
            else:
                reason = result.error or "unknown"
            last = name
        figures.attempts_failed[reason] += 1
        if reason not in RETRYABLE:
            break
        await asyncio.sleep(FAILURE_PAUSE_S)
    figures.requests_failed += 1
    figures.failures[reason] += 1
    return False


async def run(args: argparse.Namespace, stop: asyncio.Event) -> Figures:
    figures = Figures()
    counter = itertools.count()
    client = httpx.AsyncClient(limits=httpx.Limits(max_connections=args.concurrency + args.surge_concurrency + 8))
    balancer = Balancer(client, args.agent)
    start = time.monotonic()
    in_flight: set[asyncio.Task[bool]] = set()

    async def request(max_tokens: int) -> None:
        task = asyncio.create_task(one_request(balancer, args.model, next(counter), max_tokens, figures))
        in_flight.add(task)
        try:
            await task
        finally:
            in_flight.discard(task)

    async def paced(worker: int) -> None:
        for k in itertools.count():
            if args.rate:
                due = start + (k * args.concurrency + worker) / args.rate
                await asyncio.sleep(max(0.0, due - time.monotonic()))
            await request(args.max_tokens)

    async def surge() -> None:
        if args.surge_after is None or not args.surge_concurrency:
            return
        while (clock := read_clock_file(args.clock_file)) is None:  # noqa: ASYNC110 (another process writes it)
            await asyncio.sleep(POLL_S)
        await asyncio.sleep(max(0.0, clock + args.surge_after - time.time()))
        figures.surge_started_at = time.time()

        async def closed_loop() -> None:
            while True:
                await request(args.surge_max_tokens)

        await asyncio.gather(*(closed_loop() for _ in range(args.surge_concurrency)))

    def write(in_flight_now: int | None = None) -> None:
        tmp = args.stats.with_name(args.stats.name + ".tmp")
        tmp.write_text(json.dumps(figures.as_json(len(in_flight) if in_flight_now is None else in_flight_now)))
        os.replace(tmp, args.stats)

    async def report() -> None:
        while True:
            write()
            await asyncio.sleep(1.0)

    await balancer.poll()
    tasks = [asyncio.create_task(balancer.run()), asyncio.create_task(report()), asyncio.create_task(surge()),
             *(asyncio.create_task(paced(w)) for w in range(args.concurrency))]
    await stop.wait()
    cut_off = len(in_flight)
    for task in [*tasks, *in_flight]:
        task.cancel()
    await asyncio.gather(*tasks, *in_flight, return_exceptions=True)
    await client.aclose()
    # Requests cut off by the stop are neither ok nor failed: they are counted as what was in flight then.
    write(cut_off)
    return figures


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m pitstop.demo_load", description=__doc__.splitlines()[0])
    p.add_argument("--agent", required=True, help="the agent's base URL (its /v1/replicas)")
    p.add_argument("--model", required=True)
    p.add_argument("--stats", type=Path, required=True, help="where the figures go (JSON)")
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--rate", type=float, default=2.0, help="requests per second of the steady clients")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--clock-file", default="", help="the demo's fault clock (unix seconds)")
    p.add_argument("--surge-after", type=float, default=None, help="seconds on the fault clock")
    p.add_argument("--surge-concurrency", type=int, default=0)
    p.add_argument("--surge-max-tokens", type=int, default=32)
    args = p.parse_args()

    async def main_async() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await run(args, stop)

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main_async())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
