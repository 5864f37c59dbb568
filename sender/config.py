"""The sender's settings: one frozen dataclass, read from TOML, ``DIODE_SENDER_*`` and flags.

Every field is documented by the docstring under it; ``common.settings`` turns those into
``--help`` text, the ``--check-config`` view and the table in docs/sender.md. A ``SenderConfig``
is valid once constructed: ``__post_init__`` raises ``ConfigError`` naming the key and the fix.
Checks that touch the outside world (key file readable, target resolvable) run in ``load_keyring``
and at transport start, still before anything is consumed.
"""

from __future__ import annotations

import hashlib
import math
import re
import socket
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from common.errors import ConfigError
from common.raw_topic import MAX_CHAINS
from common.wire.announce import AnnounceConfig
from common.wire.config import DEFAULT_DATAGRAM_SIZE, WireConfig
from common.wire.fec import FecConfig, FecEncoder
from runtime.kafka import FETCH_QUEUE_BACKOFF_MS
from sender.filter_rules import Rule, parse_rule
from sender.pacing import PacingConfig
from sender.transport import parse_address

if TYPE_CHECKING:
    from common.wire import KeyRing

ENV_PREFIX = "DIODE_SENDER_"

StartPosition = Literal["committed", "earliest", "latest", "timestamp"]

# librdkafka properties the sender owns: setting them would break the delivery order.
_RESERVED_KAFKA = {
    "enable.auto.commit": "the sender commits only after sending (docs/sender.md)",
    "enable.auto.offset.store": "the sender stores offsets itself",
    "group.id": "use the group_id key",
    "bootstrap.servers": "use the bootstrap_servers key",
}


#: librdkafka's prefetch queue, in KiB (``queued.max.messages.kbytes``; ``kafka`` overrides).
FETCH_QUEUE_KBYTES = 16384

#: Kafka topic names: at most 249 characters of ``[a-zA-Z0-9._-]`` (Kafka's own rule).
_TOPIC_NAME = re.compile(r"[A-Za-z0-9._-]{1,249}")


@dataclass(frozen=True, kw_only=True)
class SenderConfig:
    """Settings of ``kafka-diode send``."""

    bootstrap_servers: str
    """Upstream Kafka brokers, host:port[,host:port...]."""
    target: str
    """Where datagrams go: host:port of the diode's input (the receiver's address)."""
    topics: tuple[str, ...] = ()
    """Topics to read: names, or regular expressions starting with ^ (librdkafka's rule)."""
    exclude_topics: str = ""
    """Regular expression; matching topics are never read (internal __ topics never are)."""
    rename: tuple[str, ...] = ()
    """Topic rename on the wire, ``SOURCE=FAR`` per entry (comma-separated): records of SOURCE
    travel, and land in the raw, clean and gap topics, as FAR; ``resend`` maps a bundle's FAR
    back to SOURCE with the same setting. Unlisted topics keep their names."""
    filter_rules: tuple[str, ...] = ()
    """Content filter rules, each 'ACTION FIELD REGEX' (ACTION: allow or deny; FIELD: value, key
    or header, a header name), tried before filter_file's; the first match decides
    (docs/sender.md, "Content filter"). In a TOML array any pattern works; on the command line
    and in the environment the list is comma-separated, so patterns with a comma belong in
    filter_file."""
    filter_file: Path | None = None
    """Content filter rules file, one rule per line, '#' comments; re-read on SIGHUP or when its
    mtime changes (a bad file keeps the rules in force and is logged and counted)."""
    filter_default: Literal["allow", "deny"] = "allow"
    """What happens to a record no filter rule matches: allow (send) or deny (withhold). Used
    only when filter_rules or filter_file is set."""
    filter_timeout_ms: float = 10.0
    """Longest one rule's search may take on one record, in milliseconds; a rule that runs over
    (or fails) withholds the record and counts it as an error (fail closed)."""
    filter_check_interval: float = 2.0
    """Seconds between checks of filter_file's modification time (0: only reload on SIGHUP)."""
    chain: str = ""
    """Chains (docs/sender.md, "Chains"): 'I/N' makes this sender chain I of N parallel
    sender-to-receiver paths of the same topics (each with its own group_id and receiver; give
    every chain's receiver the same raw topic, which the dedup reads on its direct layout).
    Empty: not chained."""
    chain_mode: Literal["share", "copy"] = "share"
    """With chain set: share (this chain carries the offsets whose offset modulo N is I - 1:
    load spread over N paths) or copy (every chain carries every offset: redundancy)."""
    group_id: str = "kafka-diode-sender"
    """Consumer group; committed offsets live here."""
    static_membership: bool = True
    """Join the group as a static member (Kafka's group.instance.id, derived from sender_id,
    group_id and the topic selection; kafka.group.instance.id names it instead): a sender
    restarted after a crash takes its partitions back at once, instead of ~45 s later when the
    dead member's session times out (docs/sender.md, "Restarts"). Two senders of one group on
    one host with the same topics need distinct sender_id values, or this off."""
    start_position: StartPosition = "committed"
    """Where to start on each partition when the process starts: committed (earliest when
    nothing is committed), earliest, latest, or timestamp."""
    start_timestamp: str = ""
    """With start_position = timestamp: ISO 8601 time or milliseconds since the epoch."""
    kafka: dict[str, str] = field(default_factory=dict)
    """librdkafka consumer properties passed through (security.protocol, sasl.*, ssl.*, ...)."""
    target_ports: tuple[int, ...] = ()
    """Extra destination ports on the target host (each also a receiver socket, listen_ports).
    Messages go round-robin over all ports; the fragments and copies of one message stay on one
    port; heartbeats go to every port."""
    bind: str = ""
    """Source address host[:port] to send from (picks the interface); empty: kernel chooses."""
    send_buffer: int = 4 * 1024 * 1024
    """SO_SNDBUF in bytes (capped by net.core.wmem_max)."""
    udp_gso: bool = True
    """UDP segmentation offload where the kernel has it (Linux 4.18+): a run of equal-sized
    datagrams (a large record's fragments, a backlog's full datagrams) leaves in one system call
    and the kernel or NIC cuts it into the same datagrams; pacing still holds per datagram and a
    run is never larger than the pacing burst. Off: one datagram per call. Turn it off when the
    first hop is a veth pair or a tunnel that drops whole super-packets (loss comes in bursts of
    up to 64 datagrams); on a real NIC a lost segment is one lost datagram."""
    key_file: Path | None = None
    """Key ring file written by 'kafka-diode keygen' (the active key encrypts); reloaded on
    SIGHUP or when its mtime changes."""
    key_check_interval: float = 2.0
    """Seconds between checks of the key file's modification time (0: only reload on SIGHUP)."""
    password: str | None = field(default=None, repr=False)
    """Derive the key from this password (with salt) instead of a key file. Secret."""
    salt: str = ""
    """Salt (hex, 32+ digits) for the scrypt password derivation; must match the receiver's."""
    insecure_cleartext: bool = False
    """Send without encryption (cipher none): tests and demos only; the receiver must allow it."""
    signing_key_file: Path | None = None
    """Public-key mode: this sender's Ed25519 signing key ('kafka-diode keygen --signing');
    replaces key_file. Session keys are made here and announced, sealed and signed."""
    receiver_public_key_file: Path | None = None
    """Public-key mode: the receiver's public key file ('keygen --receiver' wrote it)."""
    session_key_interval: float = 3600.0
    """Public-key mode: seconds between fresh session keys (one is also made at every start)."""
    session_key_bytes: int = 64 * 1024**3
    """Public-key mode: bytes sent under one session key before a fresh one (0: time only)."""
    announce_interval: float = 1.0
    """Public-key mode: seconds between repeats of the session key announcement."""
    announce_lead: float = 2.0
    """Public-key mode: seconds a new session key is announced before data uses it."""
    bundle_trusted_keys_file: Path | None = None
    """Public-key mode, resend: the low side's bundle signing public key(s); bundles must be
    signed by one of them."""
    max_datagram_size: int = DEFAULT_DATAGRAM_SIZE
    """Largest UDP payload in bytes; 1452 fits a 1500-byte MTU (up to 65507)."""
    compression: Literal["none", "gzip", "zstd"] = "none"
    """Payload compression before encryption: none, gzip or zstd (zstd: faster at a better ratio;
    the receiver needs no setting for either)."""
    compression_level: int = 1
    """gzip level 1..9; zstd level 1..19."""
    max_record_size: int = 16 * 1024 * 1024
    """Records larger than this (key + value + headers) are skipped, logged and counted."""
    linger: float = 0.005
    """Seconds a record may wait for more records to fill its datagram."""
    rate_bytes: float = 0.0
    """Pacing: bytes per second on the wire, every copy counted; 0 is unlimited."""
    rate_datagrams: float = 0.0
    """Pacing: datagrams per second, every copy counted; 0 is unlimited."""
    burst_seconds: float = 0.02
    """Pacing: how far sending may run ahead of the rate after an idle spell, in seconds."""
    copies: int = 1
    """Send each datagram this many times (redundancy against loss)."""
    copy_spacing: float = 0.0
    """Seconds between the copies of one datagram (spreads them past burst losses)."""
    fec_overhead: float = 0.0
    """Forward error correction: repair datagrams per 100 source datagrams (0 is off). The
    receiver needs no setting. Sources shrink so that repairs fit max_datagram_size (by 241 bytes
    with the default block size and interleave: docs/sender.md, "Forward error correction")."""
    fec_block_size: int = 160
    """FEC: source datagrams per block at most (1..255, with sources plus repairs at most 256:
    160 allows up to 60 percent overhead); larger blocks survive more loss at the same overhead
    but cost more CPU per datagram and send their repairs later. The default keeps fewer than one
    failed block per 10^9 datagrams at 20 percent overhead on 5 percent random or 2 percent
    bursty loss (docs/sender.md, "Choosing the settings")."""
    fec_block_latency: float = 0.2
    """FEC: seconds (at most 1) after its first datagram a block is closed and its repairs sent,
    even when not full (bounds the repair delay on slow streams)."""
    fec_interleave: int = 4
    """FEC: blocks filled round-robin (1..16), so a burst of consecutive losses is spread over
    them; each block spans interleave x block size datagrams of the link."""
    heartbeat_interval: float = 2.0
    """Seconds between heartbeats (highest offset sent per partition, counters)."""
    sender_id: str = field(default_factory=socket.gethostname)
    """Name of this sender in heartbeats and logs (default: the host name)."""
    batch_size: int = 2000
    """Most records taken from the consumer per call."""
    poll_timeout: float = 0.1
    """Seconds one consumer call may wait for records."""
    max_backlog_bytes: int = 4 * 1024 * 1024
    """Datagram bytes waiting for pacing above which partitions pause (resumed below half)."""
    replay_window: int = 8192
    """The receiver's replay_window (datagrams): no datagram leaves more than half of it behind
    the newest one sent, so the receiver never refuses the sender's own datagrams as replayed
    (heartbeats overtake a backlog, spaced copies leave, only within that margin). Set it to the
    receiver's value when that one is changed."""
    reassembly_timeout: float = 10.0
    """The receiver's reassembly_timeout (seconds): with pacing, start-up refuses a
    max_record_size whose fragments (every copy counted) could not leave within 80 percent of it."""
    stall_timeout: float = 60.0
    """Seconds in which nothing was read or sent while the consumer lags behind the broker
    before the sender reports a stall (metric kafka_diode_sender_stalled = 1, an ERROR log
    naming the lagging partitions) and re-creates its consumer to recover; 0 is off."""
    commit_interval: float = 1.0
    """Seconds between offset commits (always after the datagrams were sent)."""
    retry_backoff_max: float = 30.0
    """Longest wait between retries while the broker is unreachable, in seconds."""
    shutdown_timeout: float = 30.0
    """Seconds SIGTERM may spend sending what is buffered before exiting anyway."""
    loop: Literal["uvloop", "asyncio"] = "uvloop"
    """Event loop implementation."""
    metrics_port: int = 0
    """Serve Prometheus metrics on this port; 0 is off."""
    metrics_addr: str = "127.0.0.1"
    """Address for the metrics endpoint."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR."""
    log_json: bool = False
    """Log one JSON object per line."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError("bootstrap_servers", "is empty", "e.g. kafka1:9092,kafka2:9092")
        host, _ = parse_address("target", self.target)
        for port in self.target_ports:
            if not 1 <= port <= 65535:
                raise ConfigError("target_ports", f"port {port} is out of range", "use 1..65535")
        if len(set(self.target_ports)) != len(self.target_ports):
            raise ConfigError("target_ports", "lists a port twice", "name each port once")
        if len(self.target_ports) > 63:
            raise ConfigError("target_ports", "has more than 63 ports", "use at most 63")
        if self.bind:
            parse_address("bind", self.bind, default_port=0)
        if not self.topics:
            raise ConfigError("topics", "is empty", "name topics or a ^regex to read")
        for topic in self.topics:
            if topic.startswith("^"):
                _compile("topics", topic)
            elif not topic or any(c in topic for c in " ,:/"):
                raise ConfigError("topics", f"{topic!r} is not a topic name or ^regex")
        if self.exclude_topics:
            _compile("exclude_topics", self.exclude_topics)
        self.topic_map()  # validates rename
        self.inline_filter_rules()  # validates filter_rules (filter_file is read at start)
        self.chain_position()  # validates chain
        if not self.filter_timeout_ms > 0:
            raise ConfigError("filter_timeout_ms", f"is {self.filter_timeout_ms}", "use > 0")
        if self.filter_check_interval < 0:
            raise ConfigError("filter_check_interval", "is negative", "use 0 (SIGHUP only) or more")
        if not self.group_id:
            raise ConfigError("group_id", "is empty")
        if self.start_position == "timestamp":
            if not self.start_timestamp:
                raise ConfigError("start_timestamp", "is required with start_position = timestamp")
            self.start_timestamp_ms()
        for key, why in _RESERVED_KAFKA.items():
            if key in self.kafka:
                raise ConfigError(f"kafka.{key}", "cannot be passed through", why)
        keyed = (
            (self.key_file is not None)
            + (self.password is not None)
            + (self.signing_key_file is not None)
        )
        if keyed > 1:
            raise ConfigError(
                "key_file",
                "key_file, password and signing_key_file exclude each other",
                "choose one",
            )
        if (self.signing_key_file is None) != (self.receiver_public_key_file is None):
            raise ConfigError(
                "receiver_public_key_file",
                "and signing_key_file go together",
                "set both for the public-key mode, or neither",
            )
        self.announce_config()
        if keyed and self.insecure_cleartext:
            raise ConfigError("insecure_cleartext", "is set together with a key", "choose one")
        if not keyed and not self.insecure_cleartext:
            raise ConfigError(
                "key_file",
                "no key configured",
                "set key_file (kafka-diode keygen) or password + salt; "
                "insecure_cleartext = true only for tests and demos",
            )
        if not (math.isfinite(self.key_check_interval) and 0 <= self.key_check_interval <= 3600):
            raise ConfigError(
                "key_check_interval", f"is {self.key_check_interval}", "use 0 (off) .. 3600 s"
            )
        if self.password is not None and not self.salt:
            raise ConfigError("salt", "is required with password", "use the receiver's salt")
        if not 1 <= self.copies <= 16:
            raise ConfigError("copies", f"is {self.copies}", "use 1..16")
        for key in ("copy_spacing", "linger", "rate_bytes", "rate_datagrams"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(key, f"is {value}", "use a non-negative number")
        if self.copy_spacing > 10:
            raise ConfigError("copy_spacing", f"is {self.copy_spacing}", "use at most 10 s")
        for key in ("heartbeat_interval", "poll_timeout", "commit_interval", "retry_backoff_max"):
            value = getattr(self, key)
            if not (math.isfinite(value) and 0 < value <= 3600):
                raise ConfigError(key, f"is {value}", "use 0 < seconds <= 3600")
        if not (math.isfinite(self.stall_timeout) and 0 <= self.stall_timeout <= 86400):
            raise ConfigError("stall_timeout", f"is {self.stall_timeout}", "use 0 (off) .. 86400 s")
        if not 0 < self.shutdown_timeout <= 3600:
            raise ConfigError(
                "shutdown_timeout", f"is {self.shutdown_timeout}", "use 0 < s <= 3600"
            )
        if not 1 <= self.batch_size <= 100_000:
            raise ConfigError("batch_size", f"is {self.batch_size}", "use 1..100000")
        if self.max_backlog_bytes < 4 * self.max_datagram_size * self.copies:
            raise ConfigError(
                "max_backlog_bytes",
                f"{self.max_backlog_bytes} is too small",
                f"use at least 4 x max_datagram_size x copies = "
                f"{4 * self.max_datagram_size * self.copies}",
            )
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"is {self.metrics_port}", "use 0 (off) or a port")
        if self.log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
            raise ConfigError("log_level", f"is {self.log_level!r}", "use DEBUG/INFO/WARNING/ERROR")
        if not self.sender_id or len(self.sender_id) > 255:
            raise ConfigError("sender_id", "must be 1..255 characters")
        del host
        if not (math.isfinite(self.fec_overhead) and 0 <= self.fec_overhead <= 100):
            raise ConfigError("fec_overhead", f"is {self.fec_overhead}", "use 0 (off) .. 100 %")
        self.fec_config()  # its own checks name the fec_* keys
        self.wire_config()  # its own checks name the same keys
        self.pacing_config()
        self._check_window_and_pacing()

    def _check_window_and_pacing(self) -> None:
        if not 64 <= self.replay_window <= 1 << 20:
            raise ConfigError(
                "replay_window", f"is {self.replay_window}", "use the receiver's value, 64..1048576"
            )
        if not (math.isfinite(self.reassembly_timeout) and 0 < self.reassembly_timeout <= 3600):
            raise ConfigError(
                "reassembly_timeout", f"is {self.reassembly_timeout}", "use the receiver's value"
            )
        seconds = self.largest_message_seconds()
        if seconds > 0.8 * self.reassembly_timeout:
            raise ConfigError(
                "max_record_size",
                f"a record of {self.max_record_size} bytes takes {seconds:.1f} s to leave at "
                f"rate_bytes {self.rate_bytes:g} / rate_datagrams {self.rate_datagrams:g} "
                f"with copies {self.copies}, longer than 80 % of the receiver's "
                f"reassembly_timeout {self.reassembly_timeout:g} s, so it could never be "
                "reassembled",
                "lower max_record_size, raise rate_bytes/rate_datagrams, or raise "
                "reassembly_timeout on both sides",
            )

    def largest_message_seconds(self) -> float:
        """Seconds the pacer needs for every copy of a ``max_record_size`` record (0: unpaced)."""
        message = self.max_record_size + 4096  # + framing: WireConfig.max_message_size's room
        datagrams = -(-message // max(1, self.max_datagram_size - 128))  # header room per fragment
        by_bytes = message * self.copies / self.rate_bytes if self.rate_bytes else 0.0
        by_count = datagrams * self.copies / self.rate_datagrams if self.rate_datagrams else 0.0
        return max(by_bytes, by_count)

    def announce_config(self) -> AnnounceConfig:
        """The public-key mode's session-key schedule, taken from this configuration."""
        return AnnounceConfig(
            session_key_interval=self.session_key_interval,
            session_key_bytes=self.session_key_bytes,
            announce_interval=self.announce_interval,
            announce_lead=self.announce_lead,
        )

    def start_timestamp_ms(self) -> int:
        """``start_timestamp`` in milliseconds since the epoch."""
        text = self.start_timestamp.strip()
        if text.isdigit():
            return int(text)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            raise ConfigError(
                "start_timestamp",
                f"{text!r} is not a time",
                "use ISO 8601 (2024-05-01T12:00:00+00:00) or milliseconds since the epoch",
            ) from None
        if moment.tzinfo is None:
            raise ConfigError("start_timestamp", "has no time zone", "add +00:00 or Z")
        return int(moment.timestamp() * 1000)

    def targets(self) -> list[tuple[str, int]]:
        """Every destination ``(host, port)``: ``target`` first, then ``target_ports``."""
        host, port = parse_address("target", self.target)
        return [(host, port)] + [(host, p) for p in self.target_ports if p != port]

    def bind_address(self) -> tuple[str, int] | None:
        """The source address to bind, if any."""
        return parse_address("bind", self.bind, default_port=0) if self.bind else None

    def fec_config(self) -> FecConfig | None:
        """The FEC block settings, or None when ``fec_overhead`` is 0."""
        if self.fec_overhead == 0:
            return None
        return FecConfig(
            overhead=self.fec_overhead,
            block_size=self.fec_block_size,
            block_latency=self.fec_block_latency,
            interleave=self.fec_interleave,
            streams=len(self.targets()),
        )

    def topic_map(self) -> dict[str, str]:
        """``rename`` as ``{source: far}`` (identity entries dropped).

        Raises:
            ConfigError: naming ``rename``: an entry is not ``SOURCE=FAR``, a name is not a
                valid Kafka topic name, a source is listed twice, two sources share a far name,
                or a far name is also a source topic read under its own name.
        """
        mapping: dict[str, str] = {}
        for entry in self.rename:
            source, sep, far = (part.strip() for part in entry.partition("="))
            if not sep:
                raise ConfigError(
                    "rename", f"{entry!r} is not SOURCE=FAR", "e.g. orders=site1.orders"
                )
            for name in (source, far):
                if not _TOPIC_NAME.fullmatch(name) or name in (".", ".."):
                    raise ConfigError(
                        "rename", f"{name!r} is not a Kafka topic name", "use [A-Za-z0-9._-], 1-249"
                    )
            if source in mapping:
                raise ConfigError("rename", f"renames {source!r} twice", "keep one entry per topic")
            if source != far:
                mapping[source] = far
        fars = list(mapping.values())
        for far in set(fars):
            if fars.count(far) > 1:
                raise ConfigError(
                    "rename", f"renames two topics to {far!r}", "give each its own far-side name"
                )
            if far in self.topics and far not in mapping:
                raise ConfigError(
                    "rename",
                    f"{far!r} is also read under its own name",
                    "rename that topic too, or choose another far-side name",
                )
        return mapping

    def inline_filter_rules(self) -> list[Rule]:
        """``filter_rules`` compiled (raises ConfigError naming ``filter_rules`` and the entry)."""
        return [
            parse_rule(text, f"filter_rules[{i}]", "filter_rules")
            for i, text in enumerate(self.filter_rules)
        ]

    def chain_position(self) -> tuple[int, int] | None:
        """``chain`` as ``(I, N)``, or None when not chained.

        Raises:
            ConfigError: naming ``chain``: not 'I/N' with 1 <= I <= N <= MAX_CHAINS.
        """
        if not self.chain:
            return None
        index, sep, count = self.chain.partition("/")
        if not (sep and index.strip().isdigit() and count.strip().isdigit()):
            raise ConfigError("chain", f"{self.chain!r} is not I/N", "e.g. 2/3: chain 2 of 3")
        i, n = int(index), int(count)
        if not 1 <= i <= n <= MAX_CHAINS:
            raise ConfigError(
                "chain", f"{self.chain!r} is out of range", f"use 1 <= I <= N <= {MAX_CHAINS}"
            )
        return i, n

    def chain_share(self) -> tuple[int, int] | None:
        """``(residue, N)`` when this sender carries only the offsets ``offset % N == residue``
        (share mode with N > 1), else None (everything is carried)."""
        position = self.chain_position()
        if position is None or self.chain_mode != "share" or position[1] == 1:
            return None
        return position[0] - 1, position[1]

    def chain_counters(self) -> dict[str, int]:
        """The heartbeat counters that tell the far side this sender's chain (docs/protocol.md
        §5: ``chain_index``, ``chain_count``, ``chain_share``); empty when not chained."""
        position = self.chain_position()
        if position is None:
            return {}
        return {
            "chain_index": position[0],
            "chain_count": position[1],
            "chain_share": int(self.chain_mode == "share"),
        }

    @property
    def filtering(self) -> bool:
        """A content filter is configured."""
        return bool(self.filter_rules) or self.filter_file is not None

    def fec_encoder(self, keyring: KeyRing | None, session_id: bytes) -> FecEncoder | None:
        """The session's FEC encoder for ``SendPipeline(fec=...)``, or None when FEC is off."""
        fec = self.fec_config()
        if fec is None:
            return None
        return FecEncoder(
            fec, keyring, session_id=session_id, max_source_size=self.source_datagram_size()
        )

    def source_datagram_size(self) -> int:
        """Largest datagram the wire encoder builds: ``max_datagram_size``, less the room a
        repair datagram needs around it when FEC is on."""
        fec = self.fec_config()
        size = self.max_datagram_size - (fec.overhead_bytes if fec is not None else 0)
        if size < 256:
            raise ConfigError(
                "max_datagram_size", f"leaves {size} bytes for sources with FEC", "raise it"
            )
        return size

    def wire_config(self) -> WireConfig:
        """The encoder's limits."""
        return WireConfig(
            max_datagram_size=self.source_datagram_size(),
            compression=self.compression,
            compression_level=self.compression_level,
            max_record_size=self.max_record_size,
            max_message_size=max(self.max_record_size + 4096, 17 * 1024 * 1024),
            max_decompressed_size=max(self.max_record_size + 4096, 17 * 1024 * 1024),
            allow_cleartext=self.insecure_cleartext,
            linger=self.linger,
        )

    def pacing_config(self) -> PacingConfig:
        """The pacer's limits."""
        return PacingConfig(
            bytes_per_s=self.rate_bytes,
            datagrams_per_s=self.rate_datagrams,
            burst_seconds=self.burst_seconds,
            max_datagram_size=self.max_datagram_size,
        )

    def consumer_properties(self) -> dict[str, str | int | bool]:
        """librdkafka properties: ours, then the ``kafka`` pass-through on top."""
        props: dict[str, str | int | bool] = {
            "bootstrap.servers": self.bootstrap_servers,
            "group.id": self.group_id,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "auto.offset.reset": "latest" if self.start_position == "latest" else "earliest",
            # Bounded prefetch: librdkafka's own queue is part of the sender's memory bound.
            "queued.max.messages.kbytes": FETCH_QUEUE_KBYTES,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
            "client.id": f"kafka-diode-sender-{self.sender_id}",
            "reconnect.backoff.max.ms": int(self.retry_backoff_max * 1000),
        }
        props.update(self.kafka)
        return props

    def group_consumer_properties(self) -> dict[str, str | int | bool]:
        """The live sender's consumer (it joins ``group_id``): ``consumer_properties`` with the
        static member id (``static_membership``), unless ``kafka`` names one."""
        props = self.consumer_properties()
        if self.static_membership and "group.instance.id" not in props:
            props["group.instance.id"] = self.group_instance_id()
        return props

    def group_instance_id(self) -> str:
        """The derived static member id: stable across restarts of this sender, distinct for
        another group, another topic selection or another ``sender_id``."""
        selection = "\0".join((self.group_id, *sorted(self.topics), self.exclude_topics))
        digest = hashlib.sha256(selection.encode()).hexdigest()[:12]
        # Kafka accepts [a-zA-Z0-9._-], at most 249 characters.
        name = _INSTANCE_ID_UNSAFE.sub("_", self.sender_id)[:200]
        return f"kafka-diode-sender-{name}-{digest}"


_INSTANCE_ID_UNSAFE = re.compile(r"[^a-zA-Z0-9._-]")


def _compile(key: str, pattern: str) -> re.Pattern[str]:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise ConfigError(key, f"{pattern!r} is not a valid regular expression: {exc}") from None


def load_keyring(config: SenderConfig) -> KeyRing | None:
    """Load the key ring the configuration names (``None`` for insecure cleartext).

    Raises:
        ConfigError: the key file is missing, unreadable or malformed (names ``key_file``), or the
            password derivation fails (names ``password``).
    """
    from runtime import link_key  # noqa: PLC0415  imported late: keeps config import light

    return link_key.load(key_file=config.key_file, password=config.password, salt=config.salt)
