"""A real HAProxy in front of simulated replicas, health-checking the agent's per-replica readiness endpoint.

Server names are replica names, so one ``http-check`` line serves every replica:
``GET /v1/replicas/<name>/ready`` on the agent answers 200 only while the replica is READY. ``servers_up``
reads the runtime view through the admin socket (``show stat``), which is what HAProxy routes by.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from bench.harness.procs import Processes, free_port, wait_until

HAPROXY = shutil.which("haproxy") or ("/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None)
CHECK_INTER_MS = 500
CHECK_FALL = 1
CHECK_RISE = 2
# The agent's drain grace behind this HAProxy: fall x inter for it to see readiness go off, one check more of
# margin. And the settle the disruption budget needs before it counts a restarted replica again: rise x inter.
DRAIN_GRACE = CHECK_FALL * CHECK_INTER_MS / 1000.0 + 1.0
GUARD_SETTLE = CHECK_RISE * CHECK_INTER_MS / 1000.0 + 0.5


def config_text(*, port: int, socket_path: Path, servers: Mapping[str, tuple[int, int]], timeout_s: int = 120,
                backend_extra: str = "", check_inter_ms: int = CHECK_INTER_MS, check_fall: int = CHECK_FALL,
                check_rise: int = CHECK_RISE) -> str:
    """``servers``: replica name -> (engine port, port of the agent that answers for its readiness)."""
    lines = "\n".join(f"  server {name} 127.0.0.1:{engine_port} check addr 127.0.0.1 port {agent_port}"
                      for name, (engine_port, agent_port) in servers.items())
    extra = f"  {backend_extra}\n" if backend_extra else ""
    # A request an engine took but never began to answer (killed, crashed, OOM) is sent again to another server.
    # HAProxy's default (`retry-on conn-failure`) retries only a request it could not send at all. One it sent
    # on a kept-alive server connection, or on one the kernel accepted just before the engine died, gets nothing
    # back; HAProxy then answers a client connection's first request with 502 (SH--), and for a later one closes
    # the client's connection without a response and without a log line, leaving the retry to the client
    # (http_ana.c, "abort_keep_alive": the keep-alive race a browser retries). Most clients do not retry a POST;
    # httpx raises "Server disconnected without sending a response". So:
    # - `retry-on conn-failure empty-response`: HAProxy resends a request that got not one byte back. Nothing
    #   reached the client, and a completion has no side effect to repeat.
    # - `option http-buffer-request`: HAProxy keeps a copy to resend only of a request it had whole when it first
    #   sent it (stconn.c drops the L7 retry otherwise). httpx, like most clients, writes the headers and the
    #   body separately, and without this HAProxy forwards the headers alone. A request larger than
    #   tune.bufsize less tune.maxrewrite (16 KiB less 1 KiB by default) is never retried.
    # - `option redispatch`: with leastconn and more than one server UP, each retry goes to another server
    #   (HAProxy 2.6.7 and later; before, only the last one did).
    # A request whose response had begun (a stream cut mid-way) is never retried: its client saw part of it.
    # `retries 3` also bounds the harm of a request that itself kills engines: it reaches at most four.
    # `option http-no-delay`: each token's chunk goes on at once. By default HAProxy asks the kernel to hold
    # small writes for more (MSG_MORE), which suits bulk responses and delays a stream's tokens by up to 200 ms.
    # `timeout check 2s`: without it a check must be answered within `inter`, and with `fall 1` one readiness
    # answer slowed past 200 ms by a busy host took a READY replica out. Readiness off is a 503 at once; the
    # timeout is for an agent that hangs.
    return f"""global
  stats socket {socket_path} mode 600 level admin
  maxconn 4096

defaults
  mode http
  timeout connect 2s
  timeout client {timeout_s}s
  timeout server {timeout_s}s
  timeout check 2s
  retries 3
  option redispatch
  retry-on conn-failure empty-response
  option http-buffer-request
  option http-no-delay

frontend api
  bind 127.0.0.1:{port}
  default_backend engines

backend engines
  balance leastconn
  option httpchk
  http-check send meth GET uri-lf /v1/replicas/%[srv_name]/ready
  http-check expect status 200
{extra}  default-server inter {check_inter_ms}ms fall {check_fall} rise {check_rise}
{lines}
"""


def admin_command(socket_path: Path, line: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's admin socket, and its whole answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(str(socket_path))
        s.sendall(line.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode()


def servers_up(socket_path: Path, names: Sequence[str], timeout: float = 5.0) -> int:
    """How many of ``names``' servers HAProxy counts UP now (the ones it routes new requests to)."""
    lines = admin_command(socket_path, "show stat", timeout).splitlines()
    header = lines[0].lstrip("# ").split(",")
    sv, status = header.index("svname"), header.index("status")
    rows = [line.split(",") for line in lines[1:] if line and not line.startswith("#")]
    return sum(1 for r in rows if len(r) > status and r[sv] in names and r[status].startswith("UP"))


class HAProxy:
    """One HAProxy process (foreground, own process group) and its admin socket."""

    def __init__(self, tmp: Path, processes: Processes, *, agent_port: int, engines: dict[str, int]) -> None:
        if HAPROXY is None:
            raise RuntimeError("needs Debian's haproxy")
        tmp.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.socket_path = tmp / "haproxy.sock"
        self.names = list(engines)
        config = tmp / "haproxy.cfg"
        config.write_text(config_text(port=self.port, socket_path=self.socket_path,
                                      servers={name: (p, agent_port) for name, p in engines.items()}))
        processes.start_argv("haproxy", [HAPROXY, "-f", str(config), "-db"])
        wait_until(self.socket_path.exists, 20, what="HAProxy's admin socket")

    def command(self, line: str) -> str:
        return admin_command(self.socket_path, line)

    def servers_up(self) -> int:
        """How many of the replicas' servers HAProxy counts UP now (the ones it routes new requests to)."""
        return servers_up(self.socket_path, self.names)


class UpSampler:
    """Samples ``servers_up`` every ``interval`` seconds in a thread; keeps the minimum and the series."""

    def __init__(self, haproxy: HAProxy, interval: float = 0.1) -> None:
        self.haproxy = haproxy
        self.interval = interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            # A sample missed while HAProxy is busy is not a server down.
            with contextlib.suppress(OSError):
                self.samples.append((time.time(), self.haproxy.servers_up()))
            self._stop.wait(self.interval)

    def __enter__(self) -> UpSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @property
    def minimum(self) -> int | None:
        return min((n for _, n in self.samples), default=None)
