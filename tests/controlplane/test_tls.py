"""TLS by configuration: ``pitstop server`` serves HTTPS with a certificate and key from its settings."""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from pathlib import Path

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from controlplane.config import ConfigError, load_config
from tests.controlplane.test_processes import Running
from tests.helpers import free_port, wait_until

SECRET = "s3cr3t-admin-value"


def self_signed(folder: Path) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=1))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = folder / "cert.pem", folder / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_cert_and_key_go_together(tmp_path: Path) -> None:
    path = tmp_path / "cp.yaml"
    path.write_text("tls_cert_file: /x/cert.pem\n")
    with pytest.raises(ConfigError, match="tls_key_file"):
        load_config(path, env={})


@pytest.mark.slow
def test_server_speaks_https_with_the_configured_certificate(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    port = free_port()
    (tmp_path / "cp.yaml").write_text(f"tls_cert_file: {cert}\ntls_key_file: {key}\nadmin_tokens: [{SECRET}]\n")
    server = Running(["server", "--config", str(tmp_path / "cp.yaml"), "--port", str(port),
                      "--database-url", f"sqlite:///{tmp_path / 'cp.db'}"], tmp_path)
    try:
        url = f"https://127.0.0.1:{port}"
        trust = ssl.create_default_context(cafile=str(cert))

        def up() -> bool:
            try:
                return httpx.get(f"{url}/healthz", verify=trust, timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_until(up, timeout=30, what="HTTPS control plane")
        nodes = httpx.get(f"{url}/v1/nodes", verify=trust, headers={"Authorization": f"Bearer {SECRET}"})
        assert nodes.json() == []
        with pytest.raises(httpx.ConnectError):  # a client that does not trust the certificate refuses it
            httpx.get(f"{url}/healthz", timeout=5)
    finally:
        log = server.stop()
    assert SECRET not in log  # the token never reaches the log
