"""Bundle creation (low side): the open gaps of the gap topic as a signed bundle, and its QR form.

``create`` reads the gap topic with ``isolation.level=read_committed`` (the dedup writes it in
transactions), keeps the latest state of each gap key (a tombstone removes it), keeps the OPEN
gaps, merges them per source (topic, partition) and writes a signed bundle (``common.bundle``,
format in docs/resend.md). Guarantees: the file at ``--out`` is either the previous one or the
complete new one (written to a temporary file in the same directory, fsynced, then renamed); a
bundle lists only offsets some open gap reports missing; ``--max-records`` keeps the lowest offsets.
EXPIRED gaps are never listed: the dedup forgot them, so a resend could not be delivered once.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from common import bundle as bundle_format
from common.bundle_qr import qr_parts
from common.errors import BundleError, ConfigError
from common.gap_record import latest_gaps
from runtime.bundle_files import BundleKeyConfig, summary_table, write_atomically

if TYPE_CHECKING:
    from common.wire import KeyRing
    from common.wire.pubkey import TrustedKeys

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BundleConfig(BundleKeyConfig):
    """Settings of ``kafka-diode bundle create``."""

    bootstrap_servers: str
    """Downstream Kafka holding the gap topic, host:port[,...]; also env BOOTSTRAP_SERVERS."""
    gap_topic: str
    """The dedup's gap topic; env GAP_TOPIC."""
    topics: tuple[str, ...] = ()
    """Only gaps of these source topics (flag --topic, repeatable); empty: every topic."""
    max_records: int = 0
    """Most offsets in one bundle (lowest offsets first); 0 is no limit."""
    kafka: dict[str, str] = field(default_factory=dict)
    """librdkafka properties for the gap-topic reader (security.protocol, sasl.*, ...); also
    env KAFKA_CONF_*."""
    read_timeout: float = 120.0
    """Seconds reading the gap topic to its end may take."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers", "is empty", "e.g. kafka1:9092")
        if not self.gap_topic:
            raise ConfigError("gap_topic", "is empty", "use the dedup's GAP_TOPIC")
        if self.max_records < 0:
            raise ConfigError("max_records", f"is {self.max_records}", "use 0 (no limit) or more")
        if not 0 < self.read_timeout <= 3600:
            raise ConfigError("read_timeout", f"is {self.read_timeout}", "use 0 < s <= 3600")
        for key in ("bootstrap.servers", "group.id", "isolation.level", "enable.auto.commit"):
            if key in self.kafka:
                raise ConfigError(f"kafka.{key}", "cannot be passed through", "the reader sets it")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log_level", f"is {self.log_level!r}", "use DEBUG/INFO/WARNING/ERROR")


def read_gap_topic(config: BundleConfig) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of the gap topic, from its beginning to its current end.

    Raises:
        ConfigError: the Kafka client refused the ``kafka`` settings.
        ServiceError: the broker does not answer, the topic is missing, or the end is not reached
            within ``read_timeout``.
    """
    from runtime import kafka  # noqa: PLC0415  loads confluent_kafka only when reading

    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka}
    return kafka.read_to_end(conf, config.gap_topic, timeout=config.read_timeout, purpose="bundle")


def write_qr(
    path: Path, keyring: KeyRing, out_dir: Path, kind: str, trusted: TrustedKeys | None = None
) -> list[Path]:
    """Verify the bundle at ``path`` and write one image per QR payload into ``out_dir``.

    Raises:
        BundleError: refused or too large. OSError: writing.
    """
    try:
        import segno  # noqa: PLC0415  optional dependency, only for this command
    except ModuleNotFoundError as exc:
        raise BundleError(
            "QR codes need the optional 'qr' extra: pip install 'kafka-diode[qr]'"
        ) from exc

    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}") from exc
    bundle = bundle_format.verify(data, {k.key_id: k.material for k in keyring}, trusted=trusted)
    parts = qr_parts(data)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for i, payload in enumerate(parts, 1):
        image = out_dir / f"{bundle.bundle_id}-{i:02d}-of-{len(parts):02d}.{kind}"
        segno.make(payload, error="m", micro=False).save(str(image), scale=4, border=4)
        written.append(image)
    return written


def create(
    config: BundleConfig,
    *,
    out: Path | None,
    dry_run: bool,
    echo: Callable[[str], None] = print,
    now_ms: Callable[[], int] = lambda: int(time.time() * 1000),
) -> bundle_format.Bundle:
    """Read the gap topic and write (or, with ``dry_run``, only show) a signed bundle.

    Raises:
        ConfigError: key unusable. ServiceError: Kafka. OSError: writing the file.
    """
    signing = config.signing_key()
    keyring = config.keyring()
    scan = latest_gaps(read_gap_topic(config), config.topics)
    if scan.malformed:
        log.warning("%d malformed gap records were skipped", scan.malformed)
    bundle = bundle_format.build(
        scan.open_gaps,
        bundle_id=uuid.uuid4().hex[:16],
        created_at_ms=now_ms(),
        max_records=config.max_records or None,
    )
    echo(summary_table(bundle))
    listed = sum(last - first + 1 for _, _, first, last in scan.open_gaps)
    if bundle.record_count < listed:
        echo(
            f"--max-records {config.max_records}: {listed - bundle.record_count} more offsets are"
            " open; make another bundle after this one is resent"
        )
    if dry_run or out is None:
        echo("dry run: no file written")
        return bundle
    if signing is not None:
        from common.wire.pubkey import format_fingerprint  # noqa: PLC0415  keeps --help light

        data = bundle_format.sign_ed25519(bundle, signing)
        signer = f"Ed25519 key {format_fingerprint(signing.fingerprint)}"
    else:
        key = keyring.active
        data = bundle_format.sign(bundle, key_id=key.key_id, link_key=key.material)
        signer = f"key {key.key_id:08x}"
    write_atomically(out, data)
    echo(f"wrote {out} ({len(data)} bytes, signed with {signer})")
    return bundle
