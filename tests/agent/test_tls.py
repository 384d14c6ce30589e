"""Reports to an https control plane: a private CA verifies it; a pin refuses any other certificate before the
request (and its token) leaves the agent."""

from __future__ import annotations

import asyncio
import datetime as dt
import hashlib
import ipaddress
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

pytest.importorskip("cryptography", reason="the test PKI is made with cryptography (not a runtime dependency)")

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from fastapi import FastAPI, Request

from agent.config import ConfigError, parse_config
from agent.reporter import Reporter, ReportError
from agent.tls import control_plane_ssl_context, normalise_pin
from agent.wire import PROTOCOL_VERSION, DesiredState, NodeReport
from tests.helpers import free_port, wait_until


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_pki(tmp: Path) -> tuple[Path, Path, Path, str]:
    """A CA, and a server certificate for 127.0.0.1 signed by it: (ca.pem, server.pem, server.key, sha256)."""
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (x509.CertificateBuilder().subject_name(_name("pitstop test CA")).issuer_name(_name("pitstop test CA"))
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name("127.0.0.1")).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    paths = tmp / "ca.pem", tmp / "server.pem", tmp / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return *paths, hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


class HttpsControlPlane:
    def __init__(self) -> None:
        self.received = 0
        self.app = FastAPI()

        @self.app.post("/v1/agents/{node}/report")
        async def report(node: str, request: Request) -> dict[str, object]:
            await request.body()
            self.received += 1
            return {"protocol_version": PROTOCOL_VERSION, "node": node, "cordoned": True}


@pytest.fixture(scope="module")
def https_cp(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpsControlPlane, str, Path, str]]:
    ca, cert, key, fingerprint = _write_pki(tmp_path_factory.mktemp("pki"))
    cp = HttpsControlPlane()
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(cp.app, host="127.0.0.1", port=port, log_level="warning",
                                           ssl_certfile=str(cert), ssl_keyfile=str(key)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, what="https control plane")
    try:
        yield cp, f"https://127.0.0.1:{port}", ca, fingerprint
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def _send(url: str, ca: Path | None, pin: str | None) -> DesiredState:
    report = NodeReport(protocol_version=PROTOCOL_VERSION, node="n1", hostname="h", agent_version="t",
                        sent_at=dt.datetime.now(dt.UTC), sequence=1)

    async def go() -> DesiredState:
        async with httpx.AsyncClient(verify=control_plane_ssl_context(ca, pin)) as client:
            return await Reporter(client, url, "n1", token="s3cret").send(report)

    return asyncio.run(go())


def test_private_ca_verifies_the_control_plane(https_cp: tuple[HttpsControlPlane, str, Path, str]) -> None:
    cp, url, ca, fingerprint = https_cp
    before = cp.received
    assert _send(url, ca, None).cordoned is True
    colon_pin = ":".join(fingerprint[i:i + 2] for i in range(0, 64, 2)).upper()  # openssl's form
    assert _send(url, ca, colon_pin).cordoned is True
    assert cp.received == before + 2


def test_unknown_ca_and_wrong_pin_fail_before_the_request_is_sent(
        https_cp: tuple[HttpsControlPlane, str, Path, str]) -> None:
    cp, url, ca, fingerprint = https_cp
    before = cp.received
    with pytest.raises(ReportError, match=r"CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _send(url, None, None)  # system CAs do not know the private CA
    wrong = ("0" if fingerprint[0] != "0" else "1") + fingerprint[1:]
    with pytest.raises(ReportError, match="does not match control_plane_pin_sha256"):
        _send(url, ca, wrong)
    assert cp.received == before  # the token never reached the server


def test_a_pin_that_is_no_fingerprint_is_a_config_error() -> None:
    assert normalise_pin("AB:" * 31 + "AB") == "ab" * 32
    with pytest.raises(ConfigError, match="control_plane_pin_sha256"):
        parse_config("control_plane_pin_sha256: abc\n", "agent.yaml", env={})
