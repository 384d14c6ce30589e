"""HMAC-SHA256 signatures of Pitstop's webhook, both ends: the notifier signs, a receiver verifies. Pure.

The signed message is ``b"<timestamp>." + body``: the Unix time in seconds exactly as sent in
``X-Pitstop-Timestamp``, a dot, then the body's exact bytes (re-encoding parsed JSON would not give them back).
``X-Pitstop-Signature`` is ``sha256=<hex digest>``. The timestamp is signed with the body so that a receiver can
refuse a captured request replayed later: ``verify`` rejects a timestamp further than ``tolerance_seconds`` from
its own clock, in either direction.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from datetime import UTC, datetime
from typing import Literal

TIMESTAMP_HEADER = "X-Pitstop-Timestamp"
SIGNATURE_HEADER = "X-Pitstop-Signature"
SCHEME = "sha256="
DEFAULT_TOLERANCE_SECONDS = 300

Reason = Literal[
    "missing_signature", "malformed_signature", "missing_timestamp", "malformed_timestamp", "bad_signature",
    "stale_timestamp", "future_timestamp",
]

# Unix seconds, ASCII digits only (no sign, no fraction, no other scripts' digits): anything else is malformed.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"sha256=([0-9a-fA-F]{64})")


class SignatureError(ValueError):
    """A request that must not be trusted; ``reason`` says why, for the receiver's logs and metrics."""

    def __init__(self, reason: Reason, message: str) -> None:
        super().__init__(message)
        self.reason: Reason = reason


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The ``X-Pitstop-Signature`` value for ``body`` sent at ``timestamp`` (Unix seconds)."""
    if not secret:
        raise ValueError("webhook secret is empty: anyone could forge its signatures")
    if timestamp < 0:
        raise ValueError(f"timestamp {timestamp} is before 1970")
    mac = hmac.new(secret, b"%d." % timestamp + body, hashlib.sha256)
    return SCHEME + mac.hexdigest()


def verify(secret: bytes, timestamp_header: str | None, signature_header: str | None, body: bytes, now: datetime,
           tolerance_seconds: float = DEFAULT_TOLERANCE_SECONDS) -> None:
    """Return if the request is authentic and fresh, else raise ``SignatureError``.

    The signature is checked before the timestamp's age, so a caller without the secret learns only that its
    signature is wrong; a stale or future timestamp is reported only for a genuine (replayed or skewed) request.
    """
    if not secret:
        raise ValueError("webhook secret is empty: anyone could forge its signatures")
    if signature_header is None or not signature_header.strip():
        raise SignatureError("missing_signature", f"{SIGNATURE_HEADER} header is missing")
    signature = _SIGNATURE.fullmatch(signature_header.strip())
    if signature is None:
        raise SignatureError("malformed_signature", f"{SIGNATURE_HEADER} must be sha256=<64 hex digits>")
    if timestamp_header is None or not timestamp_header.strip():
        raise SignatureError("missing_timestamp", f"{TIMESTAMP_HEADER} header is missing")
    if _TIMESTAMP.fullmatch(timestamp_header.strip()) is None:
        raise SignatureError("malformed_timestamp", f"{TIMESTAMP_HEADER} must be Unix seconds (digits only)")
    timestamp = int(timestamp_header.strip())
    expected = sign(secret, timestamp, body)
    if not hmac.compare_digest(expected, SCHEME + signature.group(1).lower()):
        raise SignatureError("bad_signature", "signature does not match the body and timestamp")
    now_unix = (now.replace(tzinfo=UTC) if now.tzinfo is None else now).timestamp()
    age = now_unix - timestamp
    if age > tolerance_seconds:
        raise SignatureError("stale_timestamp",
                             f"timestamp is {age:.0f}s old, beyond the {tolerance_seconds:g}s tolerance (replay?)")
    if -age > tolerance_seconds:
        raise SignatureError("future_timestamp",
                             f"timestamp is {-age:.0f}s ahead, beyond the {tolerance_seconds:g}s tolerance")
