"""The webhook's signature, both ends: what the notifier signs a receiver verifies, and a changed body, a changed or
stale timestamp, another secret or a malformed header are each refused with their own reason."""

from __future__ import annotations

import hashlib
import hmac
from datetime import UTC, datetime, timedelta

import pytest

from controlplane.notify.signing import SignatureError, sign, verify

SECRET = b"s3cret-for-tests"
NOW = datetime(2026, 12, 1, 3, 12, tzinfo=UTC)
TS = int(NOW.timestamp())
BODY = '{"version":"1","status":"firing","receiver":"ops","note":"café ✅"}'.encode()


def _reason(exc: pytest.ExceptionInfo[SignatureError]) -> str:
    return exc.value.reason


def test_signature_is_hmac_sha256_of_timestamp_dot_body():
    expected = hmac.new(SECRET, f"{TS}.".encode() + BODY, hashlib.sha256).hexdigest()
    assert sign(SECRET, TS, BODY) == f"sha256={expected}"


def test_round_trip():
    verify(SECRET, str(TS), sign(SECRET, TS, BODY), BODY, NOW)


def test_uppercase_hex_and_surrounding_whitespace_are_accepted():
    verify(SECRET, f" {TS} ", " sha256=" + sign(SECRET, TS, BODY).removeprefix("sha256=").upper(), BODY, NOW)


def test_naive_now_is_taken_as_utc():
    verify(SECRET, str(TS), sign(SECRET, TS, BODY), BODY, NOW.replace(tzinfo=None))


@pytest.mark.parametrize("body", [BODY + b" ", BODY.replace(b"firing", b"resolv"), b"", BODY[:-1]])
def test_tampered_body_is_refused(body):
    with pytest.raises(SignatureError) as exc:
        verify(SECRET, str(TS), sign(SECRET, TS, BODY), body, NOW)
    assert _reason(exc) == "bad_signature"


def test_timestamp_changed_after_signing_is_refused():
    with pytest.raises(SignatureError) as exc:
        verify(SECRET, str(TS + 1), sign(SECRET, TS, BODY), BODY, NOW)
    assert _reason(exc) == "bad_signature"


def test_another_secret_is_refused():
    with pytest.raises(SignatureError) as exc:
        verify(b"other", str(TS), sign(SECRET, TS, BODY), BODY, NOW)
    assert _reason(exc) == "bad_signature"


def test_old_timestamp_is_a_replay():
    old = TS - 301
    with pytest.raises(SignatureError, match="old") as exc:
        verify(SECRET, str(old), sign(SECRET, old, BODY), BODY, NOW)
    assert _reason(exc) == "stale_timestamp"


def test_future_timestamp_is_refused():
    ahead = TS + 301
    with pytest.raises(SignatureError, match="ahead") as exc:
        verify(SECRET, str(ahead), sign(SECRET, ahead, BODY), BODY, NOW)
    assert _reason(exc) == "future_timestamp"


@pytest.mark.parametrize("offset", [-300, 0, 300])
def test_within_tolerance_passes(offset):
    ts = TS + offset
    verify(SECRET, str(ts), sign(SECRET, ts, BODY), BODY, NOW)


def test_tolerance_is_the_receivers_choice():
    old = TS - 90
    verify(SECRET, str(old), sign(SECRET, old, BODY), BODY, NOW, tolerance_seconds=120)
    with pytest.raises(SignatureError):
        verify(SECRET, str(old), sign(SECRET, old, BODY), BODY, NOW, tolerance_seconds=60)


def test_forged_signature_on_an_old_timestamp_says_only_bad_signature():
    """Without the secret a caller learns nothing about the freshness check."""
    with pytest.raises(SignatureError) as exc:
        verify(SECRET, str(TS - 10_000), "sha256=" + "0" * 64, BODY, NOW)
    assert _reason(exc) == "bad_signature"


@pytest.mark.parametrize(("header", "reason"), [
    (None, "missing_timestamp"), ("", "missing_timestamp"), ("  ", "missing_timestamp"),
    ("abc", "malformed_timestamp"), ("-5", "malformed_timestamp"), ("1.5", "malformed_timestamp"),
    ("1e9", "malformed_timestamp"), ("\uff11\uff12\uff13", "malformed_timestamp"), ("0x10", "malformed_timestamp"),
    ("1" * 40, "malformed_timestamp"), (f"{TS},{TS}", "malformed_timestamp"),
])
def test_malformed_timestamp_header(header, reason):
    with pytest.raises(SignatureError) as exc:
        verify(SECRET, header, sign(SECRET, TS, BODY), BODY, NOW)
    assert _reason(exc) == reason


@pytest.mark.parametrize(("header", "reason"), [
    (None, "missing_signature"), ("", "missing_signature"),
    ("deadbeef", "malformed_signature"), ("sha1=" + "a" * 40, "malformed_signature"),
    ("sha256=" + "a" * 63, "malformed_signature"), ("sha256=" + "g" * 64, "malformed_signature"),
    ("sha256=" + "a" * 65, "malformed_signature"), ("SHA256=" + "a" * 64, "malformed_signature"),
])
def test_malformed_signature_header(header, reason):
    with pytest.raises(SignatureError) as exc:
        verify(SECRET, str(TS), header, BODY, NOW)
    assert _reason(exc) == reason


def test_signature_error_is_a_value_error_with_a_message():
    with pytest.raises(ValueError, match="X-Pitstop-Signature"):
        verify(SECRET, str(TS), None, BODY, NOW)


def test_empty_secret_is_a_configuration_error():
    with pytest.raises(ValueError, match="empty"):
        sign(b"", TS, BODY)
    with pytest.raises(ValueError, match="empty"):
        verify(b"", str(TS), "sha256=" + "0" * 64, BODY, NOW)


def test_negative_timestamp_is_not_signed():
    with pytest.raises(ValueError):
        sign(SECRET, -1, BODY)


def test_timedelta_tolerance_boundary_is_inclusive():
    now = NOW + timedelta(seconds=300)
    verify(SECRET, str(TS), sign(SECRET, TS, BODY), BODY, now)
    with pytest.raises(SignatureError):
        verify(SECRET, str(TS), sign(SECRET, TS, BODY), BODY, now + timedelta(seconds=1))
