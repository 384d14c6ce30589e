"""Bearer-token checks: agents for reports, operators and viewers for reads. Empty lists mean open."""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from fastapi import HTTPException, Request, status
from pydantic import SecretStr


class TokenCheck:
    """Accepts ``Authorization: Bearer <t>`` for any configured ``t``; 401 when missing, 403 when wrong."""

    def __init__(self, tokens: Sequence[SecretStr], realm: str, *, closed_when_empty: bool = False) -> None:
        self._tokens = [t.get_secret_value().encode() for t in tokens]
        self.realm = realm
        # With no tokens of its own, refuse everyone instead of admitting everyone.
        self._closed = closed_when_empty and not self._tokens

    @property
    def enabled(self) -> bool:
        return bool(self._tokens) or self._closed

    def verdict(self, header: str | None) -> int | None:
        """None when allowed, else the HTTP status to refuse with."""
        if self._closed:
            return status.HTTP_403_FORBIDDEN
        if not self._tokens:
            return None
        scheme, _, token = (header or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return status.HTTP_401_UNAUTHORIZED
        given = token.strip().encode()
        # Compare with every token, always, in constant time: timing reveals neither which nor how much matched.
        matched = False
        for expected in self._tokens:
            matched |= hmac.compare_digest(given, expected)
        return None if matched else status.HTTP_403_FORBIDDEN

    def require(self, request: Request) -> None:
        code = self.verdict(request.headers.get("authorization"))
        if code == status.HTTP_401_UNAUTHORIZED:
            raise HTTPException(code, f"{self.realm} token required (Authorization: Bearer ...)",
                                headers={"WWW-Authenticate": "Bearer"})
        if code is not None:
            raise HTTPException(code, f"{self.realm} token not accepted")
