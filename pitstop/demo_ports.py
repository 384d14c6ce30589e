"""The demo's ports: chosen where nothing listens, and checked to be its own children's once they answer.

Choosing is only a guess: a port free now may be taken before the child binds it, and an earlier demo's
orphan answering ``/healthz`` on it looks exactly like the control plane the demo just started. So every port
the demo reports is checked after its service is up: the listening socket must belong to the child's process
tree (the agent's, for the replicas: the engines are its children). Otherwise the demo stops and says who
holds the port, rather than show someone else's process as its own.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterable

import psutil

from pitstop.demo_procs import tree

LOOPBACKS = ((socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1"))


class PortNotOurs(RuntimeError):
    """A port the demo would report is held by a process it did not start."""


def listening_ports() -> set[int]:
    """Every TCP port something listens on now, on any address, IPv4 or IPv6 (empty if that cannot be read)."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return set()
    return {c.laddr.port for c in conns if c.status == psutil.CONN_LISTEN and c.laddr}


def bindable(port: int) -> bool:
    """``port`` can be bound on the loopback addresses (IPv6's too, where there is one) now.

    A listener on ``[::1]`` alone leaves 127.0.0.1 bindable, yet ``localhost:PORT`` may well reach it."""
    for family, host in LOOPBACKS:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                if family == socket.AF_INET6:
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                s.bind((host, port))
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
                continue  # no IPv6 loopback here: nothing can listen there either
            return False
    return True


def pick_ports(preferred: int, count: int, taken: set[int]) -> list[int]:
    """``count`` ports from ``preferred`` up that nothing listens on (any address) and that bind on loopback."""
    listening = listening_ports()
    ports: list[int] = []
    candidate = preferred
    while len(ports) < count and candidate < 65536:
        if candidate not in taken and candidate not in listening and bindable(candidate):
            ports.append(candidate)
            taken.add(candidate)
        candidate += 1
    if len(ports) < count:
        raise RuntimeError(f"no free port at or above {preferred}")
    return ports


def _conns(proc: psutil.Process) -> list[object]:
    # psutil 6 renamed connections() to net_connections(); the pin allows 5.9.
    method = getattr(proc, "net_connections", None) or proc.connections
    return list(method(kind="tcp"))


def listens(procs: Iterable[psutil.Process], port: int) -> bool:
    """One of ``procs`` has a listening TCP socket on ``port``."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            for conn in _conns(proc):
                laddr = getattr(conn, "laddr", None)
                if getattr(conn, "status", None) == psutil.CONN_LISTEN and laddr and laddr.port == port:
                    return True
    return False


def holders(port: int) -> str:
    """Who listens on ``port``, as far as this user can see: "pid 123 (python3 -m http.server)", or why not."""
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return "unknown (the socket table cannot be read)"
    found = []
    for conn in conns:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr or conn.laddr.port != port:
            continue
        where = f"{conn.laddr.ip}:{port}"
        if conn.pid is None:
            found.append(f"a process of another user on {where}")
            continue
        try:
            cmd = " ".join(psutil.Process(conn.pid).cmdline())[:120]
        except psutil.Error:
            cmd = "?"
        found.append(f"pid {conn.pid} ({cmd}) on {where}")
    return "; ".join(dict.fromkeys(found)) or "nothing listens on it now"


def check_owner(name: str, port: int, pid: int) -> None:
    """Raise ``PortNotOurs`` unless the process ``pid`` or one of its descendants listens on ``port``."""
    if listens(tree(pid), port):
        return
    raise PortNotOurs(f"port {port} answers, but not from the {name} this demo started (pid {pid}): held by "
                      f"{holders(port)}")
