"""kafka_diode.local_kafka.security: certificates and SCRAM users for secured local brokers."""

from __future__ import annotations

import json
import os
from pathlib import Path

from cryptography import x509

from kafka_diode.local_kafka.security import ensure_security


def test_security_files_are_private_and_made_once(tmp_path: Path) -> None:
    first = ensure_security(tmp_path / "sec")
    again = ensure_security(tmp_path / "sec")
    assert again.client.password == first.client.password
    assert first.client.password not in repr(first)
    for name in ("ca.key", "broker.pem", "users.json", "client.properties"):
        assert (tmp_path / "sec" / name).stat().st_mode & 0o077 == 0, name
    users = json.loads((tmp_path / "sec" / "users.json").read_text())
    assert set(users) == {"admin", "diode"}
    assert os.stat(tmp_path / "sec").st_mode & 0o077 == 0


def test_the_broker_certificate_is_signed_by_the_ca_for_127_0_0_1(tmp_path: Path) -> None:
    files = ensure_security(tmp_path / "sec")
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    chain = x509.load_pem_x509_certificates(files.keystore.read_bytes())
    leaf = chain[0]
    leaf.verify_directly_issued_by(ca)
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "127.0.0.1" in [str(ip) for ip in names.get_values_for_type(x509.IPAddress)]
    assert b"PRIVATE KEY" in files.keystore.read_bytes()


def test_client_properties_in_both_spellings(tmp_path: Path) -> None:
    files = ensure_security(tmp_path / "sec")
    c = files.librdkafka()
    j = files.java()
    assert (c["security.protocol"], j["security.protocol"]) == ("SASL_SSL", "SASL_SSL")
    assert c["sasl.mechanisms"] == j["sasl.mechanism"] == "SCRAM-SHA-512"
    assert c["sasl.username"] == "diode"
    assert f'username="diode" password="{files.client.password}"' in j["sasl.jaas.config"]
    assert c["ssl.ca.location"] == j["ssl.truststore.location"] == str(files.ca)
    text = (tmp_path / "sec" / "client.properties").read_text()
    assert f"sasl.password={files.client.password}" in text
