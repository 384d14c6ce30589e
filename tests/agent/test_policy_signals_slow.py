"""Every shipped policy can act on what an agent with DEFAULT settings reports.

A policy whose condition reads a signal the agent leaves null by default (a canary switched off, process trees not
sampled, a GPU field not read, an engine metric not scraped) never fires, and nothing says so. This test runs a
real agent with the defaults, only what a test must set (node, ports, the simulated GPU backend, the state
directory, one simulated replica), records its reports in a stand-in control plane, and checks each policy's needs
against them. The needs are derived from the policies as loaded (``controlplane.policy_files``): a threshold
condition's signal, each detector's reads (below), and the conditions nested in an action (the governor's
``pressure``), so a new policy is covered without touching this file; a new detector fails here until its reads
are listed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from pydantic import BaseModel

from agent.wire import NodeReport, ReplicaState, ReplicaStatus
from bench.harness.http import probe
from controlplane.policy import conditions as c
from controlplane.policy.detectors import stall
from controlplane.policy.policy import Policy
from controlplane.policy.signals import sample_from_status
from controlplane.policy_files import load_directory
from tests.agent.conftest import REPO, ControlPlaneStandIn
from tests.helpers import free_port, http_ok, wait_until

pytestmark = pytest.mark.slow

# Where a need is read: "replica", a ``ReplicaSample`` field as the control plane builds it from a READY
# replica's status (``sample_from_status``); "gpu", a ``GpuSample`` field; "node", a ``NodeReport`` field;
# "event", a ``ReplicaStatus`` field that only an event fills (a FATAL state, an exit's code and log tail): a
# healthy run cannot fill it, so it only has to be part of the report.
Need = tuple[str, str]
_READS: dict[type, Callable[[Any], set[Need]]] = {
    c.ThresholdCondition: lambda cond: {("replica", cond.signal)},
    c.ErrorRateCondition: lambda cond: {("replica", "errors_per_second"), ("replica", "requests_per_second")},
    c.StallCondition: lambda cond: {("replica", name) for name in stall.FIELDS},
    c.LeakCondition: lambda cond: (
        {("replica", "rss_bytes")} | ({("node", "memory_total_bytes")} if cond.limit_bytes is None else set())
        if cond.resource == "rss" else
        {("replica", "gpu_memory_bytes")} | ({("gpu", "memory_total_bytes")} if cond.limit_bytes is None else set())),
    c.ThermalCondition: lambda cond: {("gpu", "temperature_celsius"), ("gpu", "slowdown_temperature_celsius")},
    c.XidCondition: lambda cond: {("gpu", "xid_events_total")},
    c.EccCondition: lambda cond: {("gpu", "ecc_uncorrected_total")},
    c.CrashLoopCondition: lambda cond: {("event", "state"), ("event", "restarts_total")},
    c.OomCrashCondition: lambda cond: {("event", "last_exit_code"), ("event", "log_tail")},
    c.AlertCondition: lambda cond: set(),  # Alertmanager's alerts, not the agent's reports
    # A report's arrival (stamped with the control plane's clock) and what runs on the node.
    c.NodeUnreachableCondition: lambda cond: {("node", "node"), ("node", "replicas")},
}


def _condition_types() -> set[type]:
    union = typing.get_args(c.Condition)[0]  # Annotated[Union[Annotated[cls, Tag], ...], Discriminator]
    return {typing.get_args(member)[0] for member in typing.get_args(union)}


def _nested_conditions(value: Any) -> Iterator[Any]:
    """Conditions inside an action (the governor's ``pressure``), at any depth."""
    if isinstance(value, BaseModel):
        if type(value) in _READS:
            yield value
        for name in type(value).model_fields:
            yield from _nested_conditions(getattr(value, name))
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _nested_conditions(item)


def needs(policy: Policy) -> set[Need]:
    """What a policy's condition (and any condition its action carries) reads from the agent's reports."""
    found: set[Need] = set()
    for cond in [policy.condition, *_nested_conditions(policy.action)]:
        found |= _READS[type(cond)](cond)
    return found


def present(report: NodeReport) -> set[Need]:
    """The needs one report fills: non-null fields of its READY replicas' samples, its GPUs and the report."""
    got: set[Need] = set()
    for status in report.replicas:
        if status.state == ReplicaState.READY:
            sample = sample_from_status(report.sent_at, status)
            got |= {("replica", f) for f in type(sample).__dataclass_fields__ if getattr(sample, f) is not None}
    for gpu in report.gpus:
        got |= {("gpu", f) for f in type(gpu).model_fields if getattr(gpu, f) is not None}
    got |= {("node", f) for f in NodeReport.model_fields if getattr(report, f) is not None}
    return got | {("event", f) for f in ReplicaStatus.model_fields}


def test_every_detector_lists_what_it_reads() -> None:
    missing = _condition_types() - set(_READS)
    assert not missing, f"list what these conditions read from the agent's reports in _READS: {missing}"


@pytest.fixture
def default_agent(tmp_path: Path,
                  control_plane: tuple[ControlPlaneStandIn, str]) -> Iterator[tuple[ControlPlaneStandIn, str]]:
    """An agent with default settings but for what a test must set, reporting to the stand-in; and its engine's
    URL."""
    stand_in, url = control_plane
    port, engine_port = free_port(), free_port()
    config = {"node": "test-node", "port": port, "control_plane": url, "gpu_backend": "sim",
              "sim_gpu_dir": str(tmp_path / "simgpu"), "state_dir": str(tmp_path / "state"),
              "replicas": [{"name": "sim-0", "model": "tiny", "port": engine_port}]}
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PITSTOP_")}
    log = tmp_path / "agent.out"
    proc = subprocess.Popen([sys.executable, "-m", "pitstop.cli", "agent", "--config", str(path)], cwd=REPO,
                            env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/healthz") or proc.poll() is not None, 20,
                   what="agent /healthz")
        assert proc.poll() is None, log.read_text()[-3000:]
        yield stand_in, f"http://127.0.0.1:{engine_port}"
    finally:
        proc.send_signal(signal.SIGTERM)  # drains and stops its engine before it exits
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def request(engine: str) -> None:
    """A little traffic, as any serving engine has: latency and request rates are windows over requests, so
    without any they are rightly null (a canary alone would feed them, and hide what the canary itself feeds)."""
    with contextlib.suppress(httpx.HTTPError):
        probe.post(f"{engine}/v1/completions", json={"model": "tiny", "prompt": "hi", "max_tokens": 4}, timeout=5)


def test_every_shipped_policy_gets_what_it_reads_from_a_default_agent(
        default_agent: tuple[ControlPlaneStandIn, str]) -> None:
    stand_in, engine = default_agent
    policies = load_directory()
    wanted = {p.name: needs(p) for p in policies}
    everything = set().union(*wanted.values())
    seen: set[Need] = set()
    read = 0
    deadline = time.monotonic() + 120  # start, warmup, then two scrapes and a canary: well under a minute
    while time.monotonic() < deadline and not everything <= seen:
        for report in stand_in.reports[read:]:
            seen |= present(report)
            read += 1
        request(engine)
        time.sleep(0.5)
    missing = {name: sorted(want - seen) for name, want in wanted.items() if not want <= seen}
    assert not missing, (f"shipped policies that a default agent cannot feed, with the fields its {read} reports "
                         f"never filled: {missing}")
    assert {"stall", "rss-leak", "gpu-memory-leak", "thermal", "itl-slo"} <= set(wanted)  # the loader read them
    assert ("replica", "preemptions_per_second") in wanted["itl-slo"]  # the governor's pressure is covered
