"""Every file a configuration names, opened before anything starts (and by ``--check-config``).

A configuration names files in two ways, both found here without a list per command:

- a field typed ``Path`` (``key_file``, ``filter_file``, ``trusted_senders_file``, ...): every one
  is an input the command reads;
- a property of a pass-through table (``kafka``, ``kafka_conf``, ``kafka_source``) that librdkafka
  or the Java client reads as a file (``FILE_PROPERTIES``: ``ssl.ca.location``,
  ``ssl.key.location``, ``ssl.truststore.location``, ...); Spark's source options carry them with a
  ``kafka.`` prefix.

A missing, unreadable or wrong-kind file raises ``ConfigError`` naming the key as the operator
wrote it (the caller's ``key`` function maps ``kafka_conf.ssl.ca.location`` to
``KAFKA_CONF_SSL_CA_LOCATION`` for the dedup), the path and the fix. Files are opened, not just
tested with ``os.access``: that is what the service will do, under the same user.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from common.errors import ConfigError

#: Client properties whose value is a file (librdkafka's configuration reference, Kafka's Java
#: client configuration); ``ssl.ca.location`` may also be a directory of certificates, or ``probe``.
FILE_PROPERTIES = frozenset(
    {
        "ssl.ca.location",
        "ssl.certificate.location",
        "ssl.key.location",
        "ssl.crl.location",
        "ssl.keystore.location",
        "ssl.truststore.location",
        "ssl.engine.location",
        "sasl.kerberos.keytab",
        "sasl.oauthbearer.assertion.private.key.file",
        "sasl.oauthbearer.assertion.jwt.template.file",
    }
)
#: Property values that are not paths (librdkafka: find the system's CA store itself).
_NOT_PATHS = {"ssl.ca.location": frozenset({"probe"})}
_DIRECTORY_OK = frozenset({"ssl.ca.location"})


def check_readable(key: str, path: Path, *, directory_ok: bool = False) -> None:
    """Open ``path`` for reading (list it, when a directory is allowed).

    Raises:
        ConfigError: naming ``key``: the file does not exist, is of the wrong kind, or cannot
            be read by this user.
    """
    if not path.exists():
        raise ConfigError(key, f"{path} does not exist", "correct the path or create the file")
    try:
        if path.is_dir():
            if not directory_ok:
                raise ConfigError(key, f"{path} is a directory", "name a file")
            next(iter(path.iterdir()), None)
        else:
            with path.open("rb"):
                pass
    except OSError as exc:
        raise ConfigError(
            key,
            f"{path} cannot be read: {exc.strerror}",
            "let the service's user read it (owner, mode, SELinux label)",
        ) from exc


def check_files(config: Any, *, key: Callable[[str], str] = str) -> None:
    """Check every file the dataclass ``config`` names (module docstring).

    ``key`` turns ``field`` or ``field.property`` into the name the operator wrote.

    Raises:
        ConfigError: the first file that cannot be read, naming its key.
    """
    for field in dataclasses.fields(config):
        value = getattr(config, field.name)
        if isinstance(value, Path):
            check_readable(key(field.name), value)
        elif isinstance(value, Mapping):
            for prop, raw in value.items():
                name = str(prop).removeprefix("kafka.")
                text = str(raw).strip()
                if name not in FILE_PROPERTIES or not text:
                    continue
                if text in _NOT_PATHS.get(name, ()):
                    continue
                check_readable(
                    key(f"{field.name}.{prop}"), Path(text), directory_ok=name in _DIRECTORY_OK
                )


def table_variable(prefixes: Mapping[str, str]) -> Callable[[str], str]:
    """A ``key`` for ``check_files`` that names a table property by its environment variable
    (``kafka_conf.ssl.ca.location`` -> ``KAFKA_CONF_SSL_CA_LOCATION``) and a field by its name
    upper-cased (the dedup's variables)."""

    def name(dotted: str) -> str:
        field, _, prop = dotted.partition(".")
        if prop and field in prefixes:
            return prefixes[field] + prop.upper().replace(".", "_")
        return dotted.upper()

    return name
