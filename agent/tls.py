"""TLS towards the control plane: a private CA (``control_plane_ca_file``) and an optional certificate pin.

The report carries the agent's bearer token, so the pin is checked inside the TLS handshake, before a single
byte of the request is sent: the SSL context returns a ``SSLObject`` subclass whose ``do_handshake``
compares the SHA-256 of the server's DER certificate with the pin (the form ``openssl x509 -noout
-fingerprint -sha256`` prints; colons and case do not matter). The pin is checked in addition to the CA
chain and the host name, never instead of them.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
from pathlib import Path


class TlsConfigError(ValueError):
    """A CA file that cannot be loaded, or a pin that is not a SHA-256 fingerprint."""


def normalise_pin(pin: str) -> str:
    """``AB:CD:...`` or ``abcd...`` -> 64 lowercase hex digits; ``TlsConfigError`` otherwise."""
    digits = pin.replace(":", "").strip().lower()
    if len(digits) != 64 or any(c not in "0123456789abcdef" for c in digits):
        raise TlsConfigError("control_plane_pin_sha256 must be a SHA-256 fingerprint (64 hex digits)")
    return digits


def certificate_sha256(der: bytes) -> str:
    return hashlib.sha256(der).hexdigest()


def _pinned_object_class(pin: str) -> type[ssl.SSLObject]:
    class PinnedSSLObject(ssl.SSLObject):
        def do_handshake(self) -> None:
            super().do_handshake()  # raises SSLWantRead/Write until the handshake is complete
            der = self.getpeercert(binary_form=True)
            if der is None or not hmac.compare_digest(certificate_sha256(der), pin):
                raise ssl.SSLCertVerificationError(
                    f"control plane certificate sha256 {certificate_sha256(der) if der else 'absent'} "
                    f"does not match control_plane_pin_sha256 {pin}")

    return PinnedSSLObject


def control_plane_ssl_context(ca_file: Path | None, pin_sha256: str | None) -> ssl.SSLContext:
    """Verification against ``ca_file`` (or the system CAs), plus the pin when one is given."""
    try:
        context = ssl.create_default_context(cafile=str(ca_file) if ca_file is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise TlsConfigError(f"control_plane_ca_file {ca_file}: {exc}") from exc
    if pin_sha256:
        context.sslobject_class = _pinned_object_class(normalise_pin(pin_sha256))
    return context
