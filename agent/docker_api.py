"""The few calls of the Docker Engine API that the container runtime makes (``agent.containers``).

Docker serves this API on a Unix socket, and Podman serves the same one (``podman system service``), so one
client drives both. It is httpx over the socket: the agent's own HTTP client, asynchronous like the rest of the
agent, with a timeout on every call and no second HTTP stack (docs/design.md, "Runtimes").

Every failure is one of two errors a person can act on: ``DaemonUnreachable`` (no daemon answers on
``docker_host``) or ``DaemonError`` (it answered, with its status and its own message).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import httpx

API_VERSION = "v1.41"  # Docker 20.10 and later, Podman 3 and later: device requests, label filters
# Calls that return at once; a stop waits for the engine as long as its grace, and a pull has no bound of ours.
CALL_TIMEOUT = 30.0


class DaemonUnreachable(Exception):
    """No daemon answered on ``docker_host``."""


class DaemonError(Exception):
    """The daemon answered a call with an error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def transport_for(docker_host: str) -> tuple[httpx.AsyncBaseTransport, str]:
    """The transport and base URL that reach ``docker_host``: ``unix:///path`` or ``tcp://host:port``."""
    if docker_host.startswith("unix://"):
        return httpx.AsyncHTTPTransport(uds=docker_host.removeprefix("unix://")), "http://docker"
    if docker_host.startswith("tcp://"):
        return httpx.AsyncHTTPTransport(), "http://" + docker_host.removeprefix("tcp://")
    raise ValueError(f"docker_host {docker_host!r}: expected unix:///path or tcp://host:port")


def demux_logs(raw: bytes) -> list[str]:
    """The lines of a container's log as the logs endpoint sends them with no terminal: frames of an 8-byte
    header (stream, three zero bytes, the length as a big-endian 32-bit number) and that many bytes. A body
    that does not parse as frames is taken as plain text (a container started with a terminal)."""
    out = bytearray()
    at = 0
    while at + 8 <= len(raw):
        stream, size = raw[at], struct.unpack(">I", raw[at + 4:at + 8])[0]
        if stream not in (0, 1, 2) or raw[at + 1:at + 4] != b"\0\0\0" or at + 8 + size > len(raw):
            return raw.decode(errors="replace").splitlines()
        out += raw[at + 8:at + 8 + size]
        at += 8 + size
    if at != len(raw):
        return raw.decode(errors="replace").splitlines()
    return out.decode(errors="replace").splitlines()


def _message(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    return str(body.get("message") or body) if isinstance(body, dict) else str(body)


class DockerApi:
    """A client of one daemon. ``close`` it when done."""

    def __init__(self, docker_host: str) -> None:
        self.docker_host = docker_host
        transport, base = transport_for(docker_host)
        self._client = httpx.AsyncClient(transport=transport, base_url=f"{base}/{API_VERSION}")

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, *, params: Mapping[str, str] | None = None,
                    body: Any = None, limit: float | None = CALL_TIMEOUT, ok: tuple[int, ...] = ()) -> httpx.Response:
        try:
            response = await self._client.request(
                method, path, params=params, json=body, timeout=limit)
        except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError,
                FileNotFoundError, ConnectionError) as exc:
            raise DaemonUnreachable(f"no container daemon answers on {self.docker_host}: {exc or type(exc).__name__}"
                                    ) from exc
        except httpx.TimeoutException as exc:
            raise DaemonUnreachable(f"the container daemon on {self.docker_host} did not answer {method} {path} "
                                    "in time") from exc
        if response.status_code >= 400 and response.status_code not in ok:
            raise DaemonError(response.status_code, _message(response))
        return response

    async def image_present(self, image: str) -> bool:
        response = await self._call("GET", f"/images/{quote(image, safe='')}/json", ok=(404,))
        return response.status_code != 404

    async def pull(self, image: str) -> None:
        """Pull ``image``; the daemon streams its progress, and says a failure in the stream, not the status."""
        name, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
        response = await self._call("POST", "/images/create", params={"fromImage": name, "tag": tag},
                                    limit=None)
        for line in response.text.splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("error"):
                raise DaemonError(500, str(event["error"]))

    async def create(self, name: str, body: Mapping[str, Any]) -> str:
        response = await self._call("POST", "/containers/create", params={"name": name}, body=body)
        return str(response.json()["Id"])

    async def start(self, ident: str) -> None:
        await self._call("POST", f"/containers/{ident}/start", ok=(304,))

    async def inspect(self, ident: str) -> dict[str, Any] | None:
        """The container's record, or None when there is no such container."""
        response = await self._call("GET", f"/containers/{ident}/json", ok=(404,))
        return None if response.status_code == 404 else dict(response.json())

    async def listed(self, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Every container, running or not, that carries all of ``labels``."""
        filters = json.dumps({"label": [f"{k}={v}" for k, v in labels.items()]})
        response = await self._call("GET", "/containers/json", params={"all": "1", "filters": filters})
        return list(response.json())

    async def stop(self, ident: str, grace: float) -> None:
        """SIGTERM (or the image's stop signal), SIGKILL after ``grace`` seconds; returns once it has exited."""
        seconds = max(0, int(grace + 0.999))
        await self._call("POST", f"/containers/{ident}/stop", params={"t": str(seconds)},
                         limit=seconds + CALL_TIMEOUT, ok=(304, 404))

    async def kill(self, ident: str) -> None:
        # 409: not running any more; 404: gone.
        await self._call("POST", f"/containers/{ident}/kill", params={"signal": "KILL"}, ok=(404, 409))

    async def remove(self, ident: str) -> None:
        await self._call("DELETE", f"/containers/{ident}", params={"force": "1", "v": "1"}, ok=(404,))

    async def log_lines(self, ident: str, tail: int = 200) -> list[str]:
        response = await self._call("GET", f"/containers/{ident}/logs",
                                    params={"stdout": "1", "stderr": "1", "tail": str(tail)}, ok=(404,))
        return [] if response.status_code == 404 else demux_logs(response.content)
