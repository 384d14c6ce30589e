"""One HTTP client for every probe the harness and the tests make.

``httpx.get`` builds a client for each call, and building one loads the CA bundle into a new TLS context: about
50 ms of CPU. A readiness probe polled ten times a second would spend half a core on that alone, on the cores
the processes under test need. This client is built once; it keeps no connection alive, so each request opens
its own, as ``httpx.get`` does: a probe never reuses a connection to a server that has since died.
"""

from __future__ import annotations

import httpx

probe = httpx.Client(limits=httpx.Limits(max_keepalive_connections=0))


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """``url`` answers 200 now; no answer, or any other, is False."""
    try:
        return probe.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False
