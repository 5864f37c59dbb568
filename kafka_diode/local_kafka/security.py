"""Secured local brokers (``--security sasl_ssl``): a TLS listener and SCRAM users.

Theory of operation
-------------------
:func:`ensure_security` makes, once per broker or cluster, in ``<dir>`` (mode 0700)::

    ca.pem            a private CA's certificate (the trust anchor clients are given)
    ca.key            its key (kept to sign more certificates; never given to a client)
    broker.pem        the brokers' PKCS#8 key and certificate chain (SAN 127.0.0.1, localhost),
                      Kafka's PEM keystore (ssl.keystore.type=PEM)
    users.json        SCRAM-SHA-512 users: ``admin`` (brokers among themselves, tests) and
                      ``diode`` (the components), random passwords, mode 0600
    client.properties        librdkafka properties for user ``diode`` (sender, receiver, dedup's
                             own clients, kafka-diode tools)
    client-java.properties   the same for Java clients (Spark's Kafka source: prefix ``kafka.``)

with ``cryptography`` (ECDSA P-256 keys, 10-year validity: a test and demo CA). Brokers then listen
with ``SASL_SSL`` on their client port (inter-broker traffic too, as user ``admin``); the KRaft
controller listener stays PLAINTEXT on 127.0.0.1. SCRAM credentials are written into the metadata
when the storage is formatted (``kafka-storage format --add-scram``), so they exist before the
first broker accepts a connection. No authorizer: any authenticated user may do anything.

Passwords live only in ``users.json``, the two client files and the broker's
``server.properties`` (all 0600); nothing here prints or logs them.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from common.errors import ConfigError

#: ``--security`` values.
SECURITY_MODES = ("plaintext", "sasl_ssl")
MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
CLIENT_USER = "diode"
_SCRAM_MODULE = "org.apache.kafka.common.security.scram.ScramLoginModule"


def validate_security(mode: str) -> str:
    """``mode`` if it is a ``--security`` value, else ConfigError."""
    if mode not in SECURITY_MODES:
        raise ConfigError("--security", f"{mode!r} is not a security mode", "plaintext or sasl_ssl")
    return mode


@dataclass(frozen=True, slots=True)
class User:
    """A SCRAM user."""

    name: str
    """The user name."""
    password: str = field(repr=False)
    """Its password (never printed)."""

    def jaas(self) -> str:
        """A Java ``sasl.jaas.config`` value logging in as this user."""
        return f'{_SCRAM_MODULE} required username="{self.name}" password="{self.password}";'


@dataclass(frozen=True, slots=True)
class SecurityFiles:
    """Where a secured broker's (or cluster's) certificates and users are."""

    directory: Path
    """The directory holding everything below."""
    admin: User
    """The brokers' own user."""
    client: User
    """The components' user."""

    @property
    def ca(self) -> Path:
        """The CA certificate clients trust."""
        return self.directory / "ca.pem"

    @property
    def keystore(self) -> Path:
        """The brokers' PEM keystore (key + chain)."""
        return self.directory / "broker.pem"

    def librdkafka(self, user: User | None = None) -> dict[str, str]:
        """librdkafka properties to connect as ``user`` (default: the components' user)."""
        who = user or self.client
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": MECHANISM,
            "sasl.username": who.name,
            "sasl.password": who.password,
            "ssl.ca.location": str(self.ca),
        }

    def java(self, user: User | None = None) -> dict[str, str]:
        """Java client properties to connect as ``user`` (without Spark's ``kafka.`` prefix)."""
        who = user or self.client
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": MECHANISM,
            "sasl.jaas.config": who.jaas(),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    def broker_settings(self, listener: str) -> dict[str, str]:
        """``server.properties`` entries for a ``SASL_SSL`` listener called ``listener``."""
        name = listener.lower()
        return {
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.{name}.{MECHANISM.lower()}.sasl.jaas.config": self.admin.jaas(),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca),
        }

    def format_args(self) -> list[str]:
        """``kafka-storage format`` arguments that create the SCRAM users."""
        return [
            arg
            for user in (self.admin, self.client)
            for arg in (
                "--add-scram",
                f"{MECHANISM}=[name={user.name},password={user.password}]",
            )
        ]


def ensure_security(directory: Path) -> SecurityFiles:
    """The certificates and users in ``directory``, made on first use (module docstring)."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    users_file = directory / "users.json"
    if not users_file.exists() or not (directory / "broker.pem").exists():
        _make_certificates(directory)
        users = {ADMIN_USER: secrets.token_hex(16), CLIENT_USER: secrets.token_hex(16)}
        _write_private(users_file, json.dumps(users, indent=1) + "\n")
    users = json.loads(users_file.read_text("utf-8"))
    files = SecurityFiles(
        directory=directory,
        admin=User(ADMIN_USER, str(users[ADMIN_USER])),
        client=User(CLIENT_USER, str(users[CLIENT_USER])),
    )
    _write_private(directory / "client.properties", _properties(files.librdkafka()))
    _write_private(
        directory / "client-java.properties",
        _properties(files.java()),
    )
    return files


def _properties(values: dict[str, str]) -> str:
    lines = ["# Written by kafka-diode local-kafka: connect as the components' SCRAM user."]
    lines += [f"{k}={v}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def _write_private(path: Path, text: str) -> None:
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)
    temp.replace(path)


def _make_certificates(directory: Path) -> None:
    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=3650))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kafka-diode local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.IPv4Address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH, x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    plain = serialization.NoEncryption()
    (directory / "ca.pem").write_bytes(ca_cert.public_bytes(pem))
    _write_private(directory / "ca.key", ca_key.private_bytes(pem, pkcs8, plain).decode())
    _write_private(
        directory / "broker.pem",
        key.private_bytes(pem, pkcs8, plain).decode()
        + cert.public_bytes(pem).decode()
        + ca_cert.public_bytes(pem).decode(),
    )
