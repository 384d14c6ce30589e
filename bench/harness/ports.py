"""Loopback ports for the servers that tests and benchmarks start, drawn below the kernel's ephemeral range.

A port from ``bind(("127.0.0.1", 0))`` lies in the ephemeral range (``/proc/sys/net/ipv4/ip_local_port_range``),
the range the kernel also draws the local port of every outgoing connection from. Between choosing such a port and
a server binding it, any connection on the machine may take it as its own local port, and the server then fails
with EADDRINUSE: an agent that never comes up, its test waiting on ``/healthz`` until it times out. No outgoing
connection is ever given a port below that range, so ports are drawn there.

Each process draws from a block of its own, in turn, so that a port is handed out once before any is handed out
again. The block comes from ``PITSTOP_TEST_PORTS`` ("FIRST-LAST", set per test worker by the suite's conftest);
the process keeps the lower half and hands the upper half down to the processes it starts (a benchmark run by a
test), so neither draws a port the other drew.
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

ENV = "PITSTOP_TEST_PORTS"
LOWEST = 10000  # above the well-known and registered ports services here use (5432, 8000, 9090, 9093, ...)
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def ephemeral_start() -> int:
    """The first port the kernel may give an outgoing connection (32768 when it cannot be read)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def root_block() -> tuple[int, int]:
    """Every port this scheme may use: from ``LOWEST`` up to the ephemeral range, exclusive."""
    return LOWEST, max(LOWEST + 64, ephemeral_start())


def parse_block(text: str) -> tuple[int, int]:
    first, _, last = text.partition("-")
    lo, hi = int(first), int(last) + 1
    if not 0 < lo < hi <= 65536:
        raise ValueError(f"{ENV}={text!r}: not a FIRST-LAST range of ports")
    return lo, hi


def format_block(block: tuple[int, int]) -> str:
    return f"{block[0]}-{block[1] - 1}"


def slice_of(block: tuple[int, int], index: int, count: int) -> tuple[int, int]:
    """The ``index``-th of ``count`` equal, disjoint parts of ``block``."""
    size = (block[1] - block[0]) // count
    if size < 2:
        raise ValueError(f"{format_block(block)} is too small for {count} parts")
    return block[0] + index * size, block[0] + (index + 1) * size


class PortCursor:
    """Hands out the ports of ``block`` in turn, from a random start, skipping any that cannot be bound now."""

    def __init__(self, block: tuple[int, int]) -> None:
        self.block = block
        self._next = random.randrange(*block)

    def take(self) -> int:
        lo, hi = self.block
        for _ in range(hi - lo):
            port, self._next = self._next, self._next + 1 if self._next + 1 < hi else lo
            if bindable(port):
                return port
        raise RuntimeError(f"no free loopback port in {format_block(self.block)}")


def bindable(port: int) -> bool:
    """Nothing holds ``port`` on 127.0.0.1 now: no listener, no connection, nothing in TIME_WAIT."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _split(block: tuple[int, int]) -> PortCursor:
    """This process draws from the lower half of ``block``; the processes it starts, from the upper half."""
    os.environ[ENV] = format_block(slice_of(block, 1, 2))
    return PortCursor(slice_of(block, 0, 2))


def use_block(block: tuple[int, int]) -> None:
    """Draw from ``block`` from now on (a test worker's share of every port), before any port is drawn."""
    global _cursor
    _cursor = _split(block)


# Split at import, before this process can start anything that would draw from the same block.
_inherited = os.environ.get(ENV)
_cursor = _split(parse_block(_inherited) if _inherited else root_block())


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing holds now and that no outgoing connection can be given."""
    return _cursor.take()
