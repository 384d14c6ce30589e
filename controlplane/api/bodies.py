"""Reading a request body that may be refused: a bounded read, and the refusal with the reason it is counted by.

Reports and Alertmanager's webhook are read by hand (not by FastAPI's body parsing) so that an oversized body
is refused before it is buffered, and every refusal is counted by its reason.
"""

from __future__ import annotations

from typing import Any

from fastapi import HTTPException, Request, status


class Rejected(HTTPException):
    """A refused request: its status, and the ``reason`` label it is counted under."""

    def __init__(self, code: int, reason: str, detail: Any) -> None:
        super().__init__(code, detail)
        self.reason = reason


async def read_body(request: Request, limit: int, what: str) -> bytes:
    """The body, or ``Rejected`` (413) as soon as it is known to be larger than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    too_large = Rejected(status.HTTP_413_CONTENT_TOO_LARGE, "too_large", f"{what} larger than {limit} bytes")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)
