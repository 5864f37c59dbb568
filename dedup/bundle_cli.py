"""``kafka-diode bundle create|show``: write and inspect resend bundles (low side).

``create`` reads the gap topic with ``isolation.level=read_committed`` (the dedup writes it in
transactions), keeps the latest state of each gap key (a tombstone removes it), keeps the OPEN
gaps, merges them per source (topic, partition) and writes a signed bundle (``common.bundle``,
format in docs/resend.md). Guarantees: the file at ``--out`` is either the previous one or the
complete new one (written to a temporary file in the same directory, fsynced, then renamed); a
bundle lists only offsets some open gap reports missing; ``--max-records`` keeps the lowest offsets.
EXPIRED gaps are never listed: the dedup forgot them, so a resend could not be delivered once.

``show`` verifies a bundle with the link key and prints it per topic and partition; a tampered,
truncated, wrong-key or wrong-version file is refused with the reason.

Settings: ``--config FILE`` (TOML, top level or a ``[bundle]`` table), then the environment, then
flags. The environment is the dedup's (``BOOTSTRAP_SERVERS``, ``GAP_TOPIC``, ``KAFKA_CONF_*``, so
the bundle unit reads the dedup's env file) overridden by ``DIODE_BUNDLE_*``.

Exit codes: 0 done; 1 failure (Kafka unreachable, file not writable); 2 configuration or usage
error; 4 bundle refused (``show``).
"""

from __future__ import annotations

import argparse
import base64
import binascii
import dataclasses
import hashlib
import json
import logging
import os
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common import bundle as bundle_format
from common import logging as diode_logging
from common import settings
from common.errors import BundleError, ConfigError, DiodeError, KeyRingError
from common.gap_record import latest_gaps

if TYPE_CHECKING:
    from common.wire import KeyRing
    from common.wire.pubkey import SigningKey, TrustedKeys

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_BAD_BUNDLE = 4

ENV_PREFIX = "DIODE_BUNDLE_"
#: The dedup's own variable names, read first so the bundle unit can share the dedup's env file.
DEDUP_ENV = {"BOOTSTRAP_SERVERS": "bootstrap_servers", "GAP_TOPIC": "gap_topic"}
DEDUP_KAFKA_PREFIX = "KAFKA_CONF_"


@dataclass(frozen=True, kw_only=True)
class BundleKeyConfig:
    """The link key that signs (create) or verifies (show) a bundle."""

    key_file: Path | None = None
    """Key ring file ('kafka-diode keygen'); the active key signs, any key in it verifies."""
    password: str | None = field(default=None, repr=False)
    """Derive the link key from this password (with salt) instead of a key file. Secret."""
    salt: str = ""
    """Salt (hex) of the password derivation; the same as the sender's and receiver's."""
    signing_key_file: Path | None = None
    """Public-key mode: the low side's Ed25519 bundle signing key ('keygen --signing'); bundles
    are signed with it instead of the link key (the sender trusts its public half)."""

    def __post_init__(self) -> None:
        if (self.key_file is not None) + (self.password is not None) + (
            self.signing_key_file is not None
        ) > 1:
            raise ConfigError(
                "key_file", "key_file, password and signing_key_file exclude each other"
            )
        if self.signing_key_file is not None:
            return
        if self.key_file is None and self.password is None:
            raise ConfigError(
                "key_file", "no link key configured", "set key_file (the link's key ring file)"
            )
        if self.password is not None and not self.salt:
            raise ConfigError("salt", "is required with password", "use the link's salt")

    def signing_key(self) -> SigningKey | None:
        """The bundle signing key of the public-key mode, or None.

        Raises:
            ConfigError: unreadable or malformed signing key file.
        """
        from common.wire.pubkey import load_signing_key  # noqa: PLC0415  keeps --help light

        if self.signing_key_file is None:
            return None
        try:
            return load_signing_key(self.signing_key_file)
        except KeyRingError as exc:
            raise ConfigError("signing_key_file", str(exc), "run 'keygen --signing'") from exc

    def trusted(self) -> TrustedKeys | None:
        """The public half of the signing key, to verify own bundles (public-key mode)."""
        from common.wire.pubkey import TrustedKeys  # noqa: PLC0415  keeps --help light

        key = self.signing_key()
        return TrustedKeys([key.public_entry()]) if key is not None else None

    def keyring(self) -> KeyRing:
        """Load the key ring (empty in the public-key mode).

        Raises:
            ConfigError: unreadable or malformed key file, or a failed derivation.
        """
        from common.wire import Key, KeyRing, derive_key  # noqa: PLC0415  keeps --help light

        if self.signing_key_file is not None:
            return KeyRing()
        if self.key_file is not None:
            try:
                return KeyRing.from_file(self.key_file)
            except (KeyRingError, OSError, ValueError) as exc:
                raise ConfigError("key_file", str(exc), "run 'kafka-diode keygen'") from exc
        assert self.password is not None
        try:
            material = derive_key(self.password, bytes.fromhex(self.salt))
        except ValueError:
            raise ConfigError("salt", "is not hexadecimal") from None
        except KeyRingError as exc:
            raise ConfigError("password", str(exc)) from exc
        key = Key.from_material(material, kdf={"name": "scrypt", "salt": self.salt})
        return KeyRing([key], active=key.key_id)


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


# -- configuration -----------------------------------------------------------------------------


def _file_values(path: Path | None) -> dict[str, Any]:
    return settings.read_toml_section(path, "bundle")


def bundle_env(env: Mapping[str, str]) -> dict[str, str]:
    """The dedup's variables translated to ``DIODE_BUNDLE_*``, then the real ``DIODE_BUNDLE_*``."""
    out: dict[str, str] = {}
    for var, name in DEDUP_ENV.items():
        if var in env:
            out[settings.env_name(ENV_PREFIX, name)] = env[var]
    for var, raw in env.items():
        if var.startswith(DEDUP_KAFKA_PREFIX) and len(var) > len(DEDUP_KAFKA_PREFIX):
            out[f"{ENV_PREFIX}KAFKA__{var[len(DEDUP_KAFKA_PREFIX) :]}"] = raw
    out.update({k: v for k, v in env.items() if k.startswith(ENV_PREFIX)})
    return out


def load_config(args: argparse.Namespace, env: Mapping[str, str]) -> BundleConfig:
    """defaults < file < environment < flags.

    Raises:
        ConfigError: naming the key.
    """
    flags = {k: v for k, v in vars(args).items() if k not in ("config", "command")}
    return settings.build(
        BundleConfig,
        file_values=_file_values(args.config),
        env=bundle_env(env),
        env_prefix=ENV_PREFIX,
        flags=flags,
    )


def load_key_config(args: argparse.Namespace, env: Mapping[str, str]) -> BundleKeyConfig:
    """The key settings only (``show``): other keys in the file or environment are ignored."""
    names = {f.name for f in dataclasses.fields(BundleKeyConfig)}
    file_values = {k: v for k, v in _file_values(args.config).items() if k in names}
    key_env = {
        k: v
        for k, v in env.items()
        if k.startswith(ENV_PREFIX) and k[len(ENV_PREFIX) :].lower() in names
    }
    flags = {k: v for k, v in vars(args).items() if k in names}
    return settings.build(
        BundleKeyConfig, file_values=file_values, env=key_env, env_prefix=ENV_PREFIX, flags=flags
    )


# -- reading the gap topic -----------------------------------------------------------------------


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


def summary_table(bundle: bundle_format.Bundle) -> str:
    """Per topic and partition: ranges, records and the first ranges."""
    rows = [("topic", "partition", "ranges", "records", "offsets")]
    rows += [(t, str(p), str(n), str(r), s) for t, p, n, r, s in bundle_format.summary_rows(bundle)]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [
        "  ".join(
            [row[0].ljust(widths[0]), *(row[i].rjust(widths[i]) for i in (1, 2, 3)), row[4]]
        ).rstrip()
        for row in rows
    ]
    lines.insert(1, "-" * max(len(line) for line in lines))
    created = datetime.fromtimestamp(bundle.created_at_ms / 1000, UTC).isoformat(timespec="seconds")
    head = (
        f"bundle {bundle.bundle_id} made {created}: {bundle.record_count} records in"
        f" {len(bundle.partitions)} partitions from {bundle.gap_count} open gaps"
    )
    if not bundle.partitions:
        return head + "\nnothing to resend"
    return "\n".join([head, *lines])


def write_atomically(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one.

    Raises:
        OSError: the directory is not writable or the disk is full.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with tmp.open("wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)  # the rename itself survives a crash
    finally:
        os.close(dir_fd)


# -- paper transfer: QR codes ------------------------------------------------------------------

QR_MAGIC = "KDB1"
QR_CHUNK = 1400
"""Base64 characters per QR code (version ~30 at error correction M: scannable from paper)."""
MAX_QR_PARTS = 32
"""More codes than this is no longer a 'small' bundle: use --max-records."""


def qr_parts(data: bytes) -> list[str]:
    """Split a bundle into QR payloads: ``KDB1 <i>/<n> <id>\n<base64 chunk>``.

    The bundle is re-serialised compactly (the MAC covers the canonical form, so it still
    verifies), zlib-compressed and base64-encoded; ``<id>`` (8 hex digits of SHA-256 of the
    compressed bytes) keeps codes of different bundles from being mixed.

    Raises:
        BundleError: the bundle needs more than ``MAX_QR_PARTS`` codes.
    """
    compact = json.dumps(json.loads(data), sort_keys=True, separators=(",", ":")).encode()
    packed = zlib.compress(compact, 9)
    digest = hashlib.sha256(packed).hexdigest()[:8]
    text = base64.b64encode(packed).decode("ascii")
    chunks = [text[i : i + QR_CHUNK] for i in range(0, len(text), QR_CHUNK)] or [""]
    if len(chunks) > MAX_QR_PARTS:
        raise BundleError(
            f"bundle needs {len(chunks)} QR codes (limit {MAX_QR_PARTS});"
            " make a smaller one with --max-records"
        )
    n = len(chunks)
    return [f"{QR_MAGIC} {i}/{n} {digest}\n{chunk}" for i, chunk in enumerate(chunks, 1)]


def join_parts(parts: Iterable[str]) -> bytes:
    """Reassemble QR payloads (any order, duplicates allowed) into the bundle's bytes.

    Raises:
        BundleError: a payload is malformed, parts of different bundles are mixed, one is
            missing, or the result is damaged.
    """
    chunks: dict[int, str] = {}
    total = digest = None
    for raw in parts:
        head, _, chunk = raw.strip().partition("\n")
        fields = head.split()
        if len(fields) != 3 or fields[0] != QR_MAGIC or "/" not in fields[1]:
            raise BundleError(f"not a kafka-diode bundle QR code: {head[:40]!r}")
        index_text, _, total_text = fields[1].partition("/")
        try:
            index, count = int(index_text), int(total_text)
        except ValueError:
            raise BundleError(f"bad part number {fields[1]!r}") from None
        if not 1 <= index <= count <= MAX_QR_PARTS:
            raise BundleError(f"bad part number {fields[1]!r}")
        if total is None:
            total, digest = count, fields[2]
        elif (count, fields[2]) != (total, digest):
            raise BundleError("QR codes of different bundles are mixed")
        chunks[index] = chunk.strip()
    if total is None:
        raise BundleError("no QR payloads given")
    missing = [i for i in range(1, total + 1) if i not in chunks]
    if missing:
        raise BundleError(f"QR codes {missing} of {total} are missing")
    try:
        packed = base64.b64decode("".join(chunks[i] for i in range(1, total + 1)), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BundleError(f"QR payload is damaged: {exc}") from exc
    if hashlib.sha256(packed).hexdigest()[:8] != digest:
        raise BundleError("QR payload is damaged (checksum mismatch)")
    inflater = zlib.decompressobj()
    try:
        data = inflater.decompress(packed, bundle_format.MAX_BUNDLE_BYTES)
    except zlib.error as exc:
        raise BundleError(f"QR payload is damaged: {exc}") from exc
    if inflater.unconsumed_tail:
        raise BundleError("QR payload decompresses beyond the bundle size limit")
    return data


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


# -- commands ------------------------------------------------------------------------------------


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


def show(
    path: Path,
    keyring: KeyRing,
    echo: Callable[[str], None] = print,
    trusted: TrustedKeys | None = None,
) -> bundle_format.Bundle:
    """Verify and print a bundle.

    Raises:
        BundleError: unreadable or refused.
    """
    try:
        with path.open("rb") as fh:
            data = fh.read(bundle_format.MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise BundleError(f"cannot read {path}: {exc.strerror}") from exc
    return show_bytes(data, keyring, echo, trusted)


def show_bytes(
    data: bytes,
    keyring: KeyRing,
    echo: Callable[[str], None] = print,
    trusted: TrustedKeys | None = None,
) -> bundle_format.Bundle:
    """Verify and print a bundle given as bytes.

    Raises:
        BundleError: refused.
    """
    bundle = bundle_format.verify(data, {k.key_id: k.material for k in keyring}, trusted=trusted)
    echo(summary_table(bundle))
    if trusted is not None and b'"Ed25519"' in data:
        echo("authentication: OK (Ed25519 with the low side's bundle key)")
    else:
        echo("authentication: OK (HMAC-SHA256 with the link key)")
    return bundle


def build_parser(prog: str) -> argparse.ArgumentParser:
    """``create``, ``show`` (and ``qr`` when available)."""
    parser = argparse.ArgumentParser(
        prog=prog,
        allow_abbrev=False,
        description="Resend bundles: the signed list of missing offsets carried to the high side.",
        epilog="Exit codes: 0 done, 1 failure, 2 configuration error, 4 bundle refused.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{create,show,qr,join}")
    c = sub.add_parser(
        "create",
        allow_abbrev=False,
        help="read the gap topic and write a signed bundle",
        description=(
            "Read the open gaps from the gap topic and write a signed bundle. Settings: --config "
            "(TOML), then BOOTSTRAP_SERVERS / GAP_TOPIC / KAFKA_CONF_* (the dedup's env), then "
            f"{ENV_PREFIX}*, then flags."
        ),
    )
    c.add_argument("--config", type=Path, help="TOML file (top level or [bundle] table)")
    c.add_argument("--out", type=Path, help="bundle file to write (atomically)")
    c.add_argument("--dry-run", action="store_true", help="print the summary only; write nothing")
    c.add_argument(
        "--topic",
        action="append",
        dest="topics",
        help="only gaps of this source topic (repeatable)",
    )
    settings.add_flags(c, BundleConfig, skip=("topics",))
    s = sub.add_parser("show", allow_abbrev=False, help="verify a bundle and print what it lists")
    s.add_argument("file", type=Path, help="bundle file")
    s.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(s, BundleKeyConfig)
    q = sub.add_parser(
        "qr",
        allow_abbrev=False,
        help="verify a small bundle and render it as QR code images (paper transfer)",
    )
    q.add_argument("file", type=Path, help="bundle file")
    q.add_argument("--out-dir", type=Path, required=True, help="directory for the images")
    q.add_argument("--format", choices=("png", "svg"), default="png", help="image format [png]")
    q.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(q, BundleKeyConfig)
    j = sub.add_parser(
        "join",
        allow_abbrev=False,
        help="rebuild a bundle from scanned QR payloads (one text file per code), verify, write",
    )
    j.add_argument("parts", type=Path, nargs="+", help="text files, each one scanned QR payload")
    j.add_argument("--out", type=Path, required=True, help="bundle file to write (atomically)")
    j.add_argument("--config", type=Path, help="TOML file with key_file (or password + salt)")
    settings.add_flags(j, BundleKeyConfig)
    return parser


def main(argv: Sequence[str], prog: str = "kafka-diode bundle") -> int:
    """Run ``bundle create`` or ``bundle show``; returns the exit code."""
    args = build_parser(prog).parse_args(list(argv))
    try:
        if args.command == "create":
            config = load_config(args, os.environ)
            if args.out is None and not args.dry_run:
                raise ConfigError("--out", "is required", "give --out FILE, or --dry-run")
            config.keyring()
            config.signing_key()
        else:
            key_config = load_key_config(args, os.environ)
            keyring = key_config.keyring()
            trusted = key_config.trusted()
    except ConfigError as exc:
        print(f"{prog} {args.command}: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if args.command != "create":
        try:
            if args.command == "show":
                show(args.file, keyring, trusted=trusted)
            elif args.command == "qr":
                for image in write_qr(args.file, keyring, args.out_dir, args.format, trusted):
                    print(image)
            else:
                data = join_parts(p.read_text(encoding="utf-8") for p in args.parts)
                show_bytes(data, keyring, trusted=trusted)
                write_atomically(args.out, data)
                print(f"wrote {args.out}")
        except BundleError as exc:
            print(f"{prog} {args.command}: bundle refused: {exc}", file=sys.stderr)
            return EXIT_BAD_BUNDLE
        except OSError as exc:
            print(f"{prog} {args.command}: failed: {exc}", file=sys.stderr)
            return EXIT_FAILED
        return EXIT_OK
    diode_logging.configure(config.log_level)
    try:
        create(config, out=args.out, dry_run=args.dry_run)
    except ConfigError as exc:
        print(f"{prog} create: configuration error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except (DiodeError, OSError) as exc:
        print(f"{prog} create: failed: {exc}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
