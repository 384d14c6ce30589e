"""Process-tree figures: RSS and process count cover the engine's children, GPU memory maps to the tree; the
client connections a wedged engine holds, the unaccepted ones included."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys

import pytest

from agent.process_tree import ProcessTreeSampler, client_connections, descendants, sum_gpu_memory, tree_pids
from tests.helpers import wait_until

# A parent that forks a child holding ~50 MB, like vLLM's API server and its EngineCore.
PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "b = bytearray(50 * 1024 * 1024); import time; time.sleep(60)"])
print("ready", flush=True)
time.sleep(60)
"""


@pytest.mark.slow
def test_rss_is_summed_over_the_whole_tree() -> None:
    proc = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, start_new_session=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"ready"
        wait_until(lambda: len(tree_pids(proc.pid)) == 2, 5, what="the child")
        sampler = ProcessTreeSampler()
        child = next(p for p in tree_pids(proc.pid) if p != proc.pid)
        wait_until(lambda: (sampler.sample(proc.pid).rss_bytes or 0) > 50 * 1024 * 1024, 5, what="child memory")
        sample = sampler.sample(proc.pid, gpu_memory={child: 1000, 424242: 5})
        assert sample.num_processes == 2
        assert sample.num_threads is not None and sample.num_threads >= 2
        assert sample.gpu_memory_bytes == 1000  # the child's GPU memory belongs to the replica
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the parent and the child it forked
        proc.wait()


def test_missing_process_reads_empty() -> None:
    sampler = ProcessTreeSampler()
    assert sampler.sample(None).rss_bytes is None
    assert sampler.sample(2**22 + 12345).rss_bytes is None
    assert sum_gpu_memory({1: 10, 2: 20, 3: 40}, [1, 3]) == 50


@pytest.mark.slow
def test_descendants_from_proc_match_psutils_walk() -> None:
    # A shell with two children, one of which has its own child: the tree an API server and EngineCore make.
    proc = subprocess.Popen(["sh", "-c", "sleep 30 & sh -c 'sleep 30 & wait' & wait"], start_new_session=True)
    try:
        wait_until(lambda: len(tree_pids(proc.pid)) == 4, 5, what="the tree")
        found = descendants(proc.pid)
        assert found is not None and set(found) == tree_pids(proc.pid) - {proc.pid}
        assert descendants(2**22 + 12345) is None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# An API server that froze after accepting one connection: the rest wait in its listen backlog.
FROZEN_SERVER = """
import socket, sys, time
host = sys.argv[1]
server = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
if ":" in host:
    server.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack, as uvicorn binds "::"
server.bind((host, 0))
server.listen(16)
print(server.getsockname()[1], flush=True)
accepted, _ = server.accept()
print("accepted", flush=True)
time.sleep(60)
"""
CLIENTS = """
import socket, sys, time
held = [socket.create_connection(("127.0.0.1", int(sys.argv[1]))) for _ in range(3)]
print("connected", flush=True)
time.sleep(60)
"""


@pytest.mark.parametrize("host", ["127.0.0.1", "::"])
def test_requests_held_by_a_frozen_server_count_the_unaccepted_ones_and_not_the_agents_own(host: str) -> None:
    if host == "::" and not socket.has_ipv6:
        pytest.fail("this host has no IPv6: the dual-stack case cannot run")
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(subprocess.Popen([sys.executable, "-c", FROZEN_SERVER, host],
                                                      stdout=subprocess.PIPE, text=True))
        stack.callback(server.kill)
        assert server.stdout is not None
        port = int(server.stdout.readline())
        clients = stack.enter_context(subprocess.Popen([sys.executable, "-c", CLIENTS, str(port)],
                                                       stdout=subprocess.PIPE, text=True))
        stack.callback(clients.kill)
        assert clients.stdout is not None and clients.stdout.readline().strip() == "connected"
        assert server.stdout.readline().strip() == "accepted"  # one of the three; two never will be
        # This process stands for the agent: its own connection (a canary, a scrape) is not a lost request.
        own = stack.enter_context(socket.create_connection(("127.0.0.1", port)))
        assert own.getsockname()
        assert client_connections(server.pid, port) == 3


def test_connections_of_a_process_gone_are_unknown() -> None:
    assert client_connections(2**22 + 1, 8000) is None  # above Linux's highest pid_max: no such process
