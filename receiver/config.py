"""Settings of ``kafka-diode receive``: one frozen dataclass, documented field by field.

Layers (``common.settings``): defaults < TOML file (``--config``) < ``DIODE_RECEIVER_*``
environment < flags. ``__post_init__`` refuses anything invalid with a ``ConfigError`` naming the
key and the fix, so a bad configuration stops the process at start-up (exit code 2), never later.
The wire limits are the decoder's (``common.wire.WireConfig``) and default to its values, except
``max_datagram_size`` which defaults to the largest UDP payload so that any sender size is read.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from common.errors import ConfigError
from common.raw_topic import fill_topic
from common.topic_limits import RECORD_OVERHEAD, record_limit
from common.wire.config import MAX_DATAGRAM_SIZE, WireConfig
from common.wire.pubkey_decoder import PublicKeyReceiveConfig

ENV_PREFIX = "DIODE_RECEIVER_"

_WIRE_DEFAULTS = WireConfig()
#: Receiver fields handed to the decoder's WireConfig unchanged (same names, same meaning).
WIRE_FIELDS = (
    "max_datagram_size",
    "max_record_size",
    "max_message_size",
    "max_decompressed_size",
    "max_fragments",
    "max_reassemblies",
    "max_reassembly_bytes",
    "reassembly_timeout",
    "replay_window",
    "max_sessions",
    "allow_cleartext",
)
#: librdkafka's largest ``message.max.bytes``.
LIBRDKAFKA_MAX_MESSAGE_BYTES = 1_000_000_000
_TOPIC_CHARS = re.compile(r"[A-Za-z0-9._-]+")
#: Producer properties the receiver relies on; ``kafka`` may not change them. Every raw record (a
#: run) gets its delivery report in Python: a success counts the run's records as delivered, a
#: failure names its offsets (one report per run, not per source record: receiver/kafka_sink.py).
PINNED_KAFKA = {"enable.idempotence": "true", "acks": "all", "delivery.report.only.error": "false"}
#: An idempotent librdkafka producer lets a partition have another request in flight only while
#: fewer than this many *records* (raw records: runs) are in flight, its limit of 5 requests
#: compared with a count of records (rdkafka_broker.c, ``rd_kafka_toppar_producer_serve``). With
#: batches of 5 or more runs one request per partition is in flight, and the broker thread, woken
#: for the next ready batch before that check, polls busily until the broker answers: on a host
#: whose broker is short of CPU that spin took most of the receiver's CPU. Batches of at most 4
#: runs (up to 256 KiB at the default ``run_max_bytes``) keep two requests in flight and the thread
#: asleep (docs/benchmarks.md, "End to end").
IDEMPOTENT_INFLIGHT_RECORDS = 5
#: Defaults of the run settings (docs/receiver.md, "Runs"). 64 KiB: a dedup micro-batch holds up
#: to MAX_OFFSETS_PER_TRIGGER runs, and a 1.5 GB batch of 1 MB runs ran a local dedup's JVM out of
#: memory (it exits, and again at each restart); 10,000 runs of 64 KiB (640 MB) pass in its
#: default heap (docs/benchmarks.md, "Dedup"). 64 KiB still holds ~250
#: records of 200 B, so the per-run costs stay amortised.
DEFAULT_RUN_MAX_BYTES = 65_536
DEFAULT_RUN_LINGER = 0.02
DEFAULT_HEARTBEAT_REPEAT_INTERVAL = 10.0
#: A paced sender's sends arrive one by one (a GSO run per large record), so without a pause the
#: receiver wakes once per send, and at its raised CPU share (packaging/systemd) preempts the
#: sender, brokers and dedup each time (docs/receiver.md, "Sockets and speed").
DEFAULT_READ_PAUSE = 0.002
#: At most 50 ms: 50 ms of a 10 Gbit/s link (62.5 MB) still fits the default rcvbuf_bytes.
MAX_READ_PAUSE = 0.05
#: Throughput-oriented producer defaults; ``kafka`` overrides any of them. batch.num.messages
#: below IDEMPOTENT_INFLIGHT_RECORDS: see there. linger.ms 100: at a low rate a partition's batch
#: waits that long for its runs (fewer requests for the downstream broker), which is noise next
#: to the dedup's micro-batches.
DEFAULT_KAFKA = {
    "linger.ms": "100",
    "batch.size": "1000000",
    "batch.num.messages": "4",
    "compression.type": "none",  # docs/receiver.md: the raw topic is a buffer, not an archive
    "message.timeout.ms": "0",
    "retry.backoff.ms": "200",
    "reconnect.backoff.max.ms": "2000",
    "socket.keepalive.enable": "true",
}


@dataclass(frozen=True, kw_only=True)
class ReceiverConfig:
    """Everything ``kafka-diode receive`` can be told; see docs/receiver.md."""

    bootstrap_servers: str = "localhost:9092"
    """Downstream Kafka bootstrap servers (host:port[,host:port...]) the raw topic lives on."""
    raw_topic: str = "diode.raw"
    """Raw topic name, or a template where {topic} is replaced by the source topic name."""
    listen_host: str = "0.0.0.0"  # noqa: S104  a receiver listens on the diode-facing interface
    """Address the UDP sockets bind to (0.0.0.0 for all IPv4 interfaces, :: for IPv6)."""
    listen_port: int = 9470
    """UDP port the sender sends to."""
    listen_ports: tuple[int, ...] = ()
    """Extra UDP ports besides listen_port (the sender's target_ports), each with its own
    socket(s); one sender spreads its messages over all of them."""
    sockets: int = 1
    """UDP sockets per port sharing it via SO_REUSEPORT (the kernel spreads senders by address)."""
    worker_processes: bool = False
    """Run one worker process per socket (each with its own decoder, producer and metrics port)."""
    rcvbuf_bytes: int = 64 * 1024 * 1024
    """Requested SO_RCVBUF per socket; as root SO_RCVBUFFORCE bypasses net.core.rmem_max."""
    max_datagrams_per_wakeup: int = 512
    """Datagrams read from one socket per readiness event before yielding to the event loop."""
    read_pause: float = DEFAULT_READ_PAUSE
    """Seconds a socket is left unread after a read found it empty, so that what arrives
    meanwhile is read in one wakeup, not one wakeup per sender's send (0: read at once). Adds up
    to this much latency; the socket buffer holds it (2 ms of 1 Gbit/s is 250 KB)."""
    udp_gro: bool = True
    """UDP receive offload where the kernel has it (Linux 5.0+): one read returns a run of
    datagrams of one flow (a sender's GSO run on loopback, what the NIC coalesced), and the
    datagrams of a large record that came in one run are decoded in one call; a datagram that
    arrives alone is read as before. Records of 10 KB and 100 KB cost the receiver about half the
    CPU per byte they cost with it off, and a flood of single datagrams (hostile or malformed
    input) is drained as fast either way: reads are split by the datagrams' own length, the
    kernel is asked once per wakeup (docs/benchmarks.md, "Transport per byte" and "Hostile flood,
    GRO on and off"). Off: one datagram per read, for kernels or middleboxes where coalescing
    is unwanted."""
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """Event loop implementation: uvloop (fast) or the standard asyncio loop."""
    key_file: Path | None = None
    """Key ring file from 'kafka-diode keygen'; reloaded on SIGHUP or when its mtime changes."""
    key_check_interval: float = 2.0
    """Seconds between checks of the key file's modification time (0: only reload on SIGHUP)."""
    receiver_key_file: Path | None = None
    """Public-key mode: this receiver's X25519 key pair(s) ('kafka-diode keygen --receiver');
    replaces key_file. Reloaded like key_file."""
    trusted_senders_file: Path | None = None
    """Public-key mode: Ed25519 public keys of the senders whose key announcements are accepted
    ('keygen --signing' wrote each, 'keygen --merge' joins them); reloaded without a restart."""
    max_clock_skew: float = 300.0
    """Public-key mode: seconds the sender's and receiver's clocks may differ at validity checks."""
    retire_grace: float = 30.0
    """Public-key mode: seconds an older session key stays usable after its successor arrived."""
    hold_datagrams: int = 4096
    """Public-key mode: datagrams under a not-yet-announced key held for its announcement."""
    hold_bytes: int = 16 * 1024 * 1024
    """Public-key mode: bytes of such held datagrams at most."""
    hold_timeout: float = 5.0
    """Public-key mode: seconds a held datagram waits for its key (then dropped: unknown_key)."""
    max_datagram_size: int = MAX_DATAGRAM_SIZE
    """Largest datagram accepted; the default accepts any size a sender may be configured with."""
    max_record_size: int = _WIRE_DEFAULTS.max_record_size
    """Largest record accepted (key + value + headers), in bytes."""
    max_message_size: int = _WIRE_DEFAULTS.max_message_size
    """Largest message (batch after compression, before fragmentation) reassembled, in bytes."""
    max_decompressed_size: int = _WIRE_DEFAULTS.max_decompressed_size
    """Largest size a compressed message may inflate to (gzip bomb guard), in bytes."""
    max_fragments: int = _WIRE_DEFAULTS.max_fragments
    """Most fragments one message may claim."""
    max_reassemblies: int = _WIRE_DEFAULTS.max_reassemblies
    """Most fragmented messages in reassembly at once (oldest evicted beyond that)."""
    max_reassembly_bytes: int = _WIRE_DEFAULTS.max_reassembly_bytes
    """Total declared bytes of all messages in reassembly (oldest evicted beyond that)."""
    reassembly_timeout: float = _WIRE_DEFAULTS.reassembly_timeout
    """Seconds a fragmented message may take to complete before it is dropped."""
    replay_window: int = _WIRE_DEFAULTS.replay_window
    """Anti-replay window per sender session, in datagrams."""
    max_sessions: int = _WIRE_DEFAULTS.max_sessions
    """Sender sessions tracked at once (least recently used evicted)."""
    allow_cleartext: bool = False
    """Accept unencrypted datagrams (cipher none): tests and demos only."""
    buffer_max_records: int = 1_000_000
    """Records the producer may hold while downstream Kafka is slow or away (then: backlog)."""
    buffer_max_bytes: int = 512 * 1024 * 1024
    """Bytes the producer may hold while downstream Kafka is slow or away (then: backlog)."""
    backlog_max_records: int = 100_000
    """Records held while the producer queue is full or a partition count unknown; then overflow."""
    backlog_max_bytes: int = 64 * 1024 * 1024
    """Bytes (raw values and keys) held in that backlog; then overflow. With ``buffer_max_bytes``
    it bounds what a downstream outage holds in memory: ``backlog_max_records`` alone lets
    100,000 records of 10 KB (1 GB) wait, past the unit's ``MemoryMax=1G`` (docs/receiver.md)."""
    run_max_bytes: int = DEFAULT_RUN_MAX_BYTES
    """Largest value of a raw record holding a run of records (raw layout v2); a record larger
    than this alone is a run of one. The raw topic's max.message.bytes must admit it."""
    run_linger: float = DEFAULT_RUN_LINGER
    """Seconds a run may wait for the next record of its partition before it is written (0: runs
    end with each datagram)."""
    heartbeat_repeat_interval: float = DEFAULT_HEARTBEAT_REPEAT_INTERVAL
    """Seconds between raw-topic writes of a partition's heartbeat that repeats the last one
    written (same session, high and low offset); a changed one is written at once. Each
    heartbeat record makes the dedup run a micro-batch (0: write every heartbeat). Keep it
    below 'kafka-diode status --silent-after' (30 s), which reads the last one's age."""
    create_raw_topic: bool = True
    """Create a missing raw topic with raw_topic_partitions, raw_topic_replication,
    raw_topic_min_insync_replicas and the max.message.bytes the largest raw record needs: a fixed
    raw_topic at start-up, each topic of a {topic} template when its first record arrives; an
    existing topic is left as it is."""
    raw_topic_partitions: int = 6
    """Partitions of a raw topic the receiver creates (the dedup runs a task and a
    transaction per group of raw partitions, as many groups as its cores: at least its cores)."""
    raw_topic_replication: int = 3
    """Replication factor of a raw topic the receiver creates (-1: the broker's
    default.replication.factor; 1 for a single-broker test cluster)."""
    raw_topic_min_insync_replicas: int = 2
    """min.insync.replicas of a raw topic the receiver creates (-1: the broker's default): with
    acks=all a write needs this many replicas, so one broker may be down without loss."""
    metadata_timeout: float = 5.0
    """Seconds one raw topic metadata lookup (partition count) may take before it is retried."""
    metadata_refresh: float = 300.0
    """Seconds between re-reads of a raw topic's partition count."""
    shutdown_timeout: float = 30.0
    """Seconds SIGTERM waits for the producer to deliver what it holds before giving up."""
    kafka: dict[str, str] = field(default_factory=dict)
    """librdkafka producer properties passed through (e.g. security.protocol, linger.ms)."""
    metrics_port: int = 0
    """Prometheus /metrics port (0: off); worker process i uses port + i."""
    metrics_addr: str = "127.0.0.1"
    """Address the metrics endpoint listens on."""
    overflow_report_interval: float = 10.0
    """Seconds between log lines summarising overflowed or undeliverable offset ranges."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    """Log level."""
    log_json: bool = False
    """Log one JSON object per line."""

    def __post_init__(self) -> None:
        def need(ok: bool, key: str, problem: str, fix: str) -> None:
            if not ok:
                raise ConfigError(key, problem, fix)

        need(bool(self.bootstrap_servers.strip()), "bootstrap_servers", "is empty", "host:port")
        template = fill_topic(self.raw_topic, "x")
        need(
            bool(_TOPIC_CHARS.fullmatch(template)) and len(template) <= 249,
            "raw_topic",
            f"{self.raw_topic!r} is not a valid Kafka topic name or template",
            "use letters, digits, '.', '_', '-' and optionally {topic}",
        )
        need(0 <= self.listen_port <= 65535, "listen_port", "is outside 0..65535", "e.g. 9470")
        need(1 <= self.sockets <= 64, "sockets", f"{self.sockets} is outside 1..64", "e.g. 2")
        for port in self.listen_ports:
            need(1 <= port <= 65535, "listen_ports", f"port {port} is outside 1..65535", "9471")
        ports = self.ports()
        need(
            len(set(ports)) == len(ports),
            "listen_ports",
            "names a port twice (or listen_port again)",
            "list each extra port once, without listen_port",
        )
        need(
            len(ports) * self.sockets <= 64,
            "listen_ports",
            f"{len(ports)} ports x {self.sockets} sockets is more than 64 sockets",
            "use fewer ports or fewer sockets per port",
        )
        need(
            4096 <= self.rcvbuf_bytes <= 1 << 31,
            "rcvbuf_bytes",
            f"{self.rcvbuf_bytes} is outside 4096..2147483648",
            "e.g. 67108864",
        )
        need(
            1 <= self.max_datagrams_per_wakeup <= 65536,
            "max_datagrams_per_wakeup",
            "is outside 1..65536",
            "e.g. 512",
        )
        need(
            0 <= self.read_pause <= MAX_READ_PAUSE,
            "read_pause",
            f"{self.read_pause} is outside 0..{MAX_READ_PAUSE} seconds",
            f"e.g. {DEFAULT_READ_PAUSE} (0 reads at once)",
        )
        need(
            self.key_file is not None or self.receiver_key_file is not None or self.allow_cleartext,
            "key_file",
            "is required unless allow_cleartext is true",
            "create one with 'kafka-diode keygen --out FILE' and set key_file, or use the "
            "public-key mode (receiver_key_file and trusted_senders_file)",
        )
        need(
            self.key_file is None or self.receiver_key_file is None,
            "receiver_key_file",
            "and key_file are both set",
            "choose the shared-key mode (key_file) or the public-key mode (receiver_key_file)",
        )
        need(
            (self.receiver_key_file is None) == (self.trusted_senders_file is None),
            "trusted_senders_file",
            "and receiver_key_file go together",
            "set both for the public-key mode, or neither",
        )
        self.pubkey_config()
        need(
            0 <= self.max_clock_skew <= 86400,
            "max_clock_skew",
            "is outside 0..86400",
            "e.g. 300",
        )
        need(self.key_check_interval >= 0, "key_check_interval", "is negative", "e.g. 2")
        for name in (
            "buffer_max_records", "buffer_max_bytes", "backlog_max_records", "backlog_max_bytes"
        ):  # fmt: skip
            need(getattr(self, name) >= 1, name, "must be positive", "e.g. the default")
        need(
            self.buffer_max_records <= 2_147_483_647,
            "buffer_max_records",
            "is above librdkafka's limit 2147483647",
            "lower it",
        )
        need(
            1024 <= self.buffer_max_bytes <= 2_147_483_647 * 1024,
            "buffer_max_bytes",
            "is outside librdkafka's range 1 KiB..2 TiB",
            "e.g. 536870912",
        )
        need(
            1 <= self.raw_topic_partitions <= 100_000,
            "raw_topic_partitions",
            f"{self.raw_topic_partitions} is outside 1..100000",
            "e.g. 6",
        )
        for name in ("raw_topic_replication", "raw_topic_min_insync_replicas"):
            value = getattr(self, name)
            need(
                value == -1 or 1 <= value <= 32,
                name,
                f"{value} is neither -1 (the broker's default) nor in 1..32",
                "e.g. 3 replicas with 2 in sync; 1 and 1 for a single-broker cluster",
            )
        need(
            self.raw_topic_replication == -1
            or self.raw_topic_min_insync_replicas <= self.raw_topic_replication,
            "raw_topic_min_insync_replicas",
            f"{self.raw_topic_min_insync_replicas} is above raw_topic_replication "
            f"{self.raw_topic_replication}: no write to the created topic could succeed",
            "at most raw_topic_replication - 1, so a broker may be down",
        )
        for name in ("metadata_timeout", "metadata_refresh", "overflow_report_interval"):
            need(getattr(self, name) > 0, name, "must be positive", "e.g. the default")
        need(self.shutdown_timeout >= 0, "shutdown_timeout", "is negative", "e.g. 30")
        need(0 <= self.metrics_port <= 65535, "metrics_port", "is outside 0..65535", "e.g. 9471")
        for prop, pinned in PINNED_KAFKA.items():
            if prop in self.kafka and self.kafka[prop].lower() != pinned:
                raise ConfigError(
                    f"kafka.{prop}",
                    f"{self.kafka[prop]!r} would weaken delivery",
                    f"the receiver always uses {prop}={pinned}; remove it",
                )
        run_limit = LIBRDKAFKA_MAX_MESSAGE_BYTES - RECORD_OVERHEAD
        need(
            1024 <= self.run_max_bytes <= run_limit,
            "run_max_bytes",
            f"{self.run_max_bytes} is outside 1024..{run_limit}",
            f"e.g. {DEFAULT_RUN_MAX_BYTES}",
        )
        need(
            0 <= self.run_linger <= 10,
            "run_linger",
            f"{self.run_linger} is outside 0..10 seconds",
            f"e.g. {DEFAULT_RUN_LINGER}",
        )
        need(
            0 <= self.heartbeat_repeat_interval <= 3600,
            "heartbeat_repeat_interval",
            f"{self.heartbeat_repeat_interval} is outside 0..3600 seconds",
            f"e.g. {DEFAULT_HEARTBEAT_REPEAT_INTERVAL} (0: write every heartbeat)",
        )
        key, size = self.raw_size_setting()
        needed = record_limit(size)
        need(
            needed <= LIBRDKAFKA_MAX_MESSAGE_BYTES,
            key,
            f"{size} needs Kafka messages of {needed} bytes, above librdkafka's "
            f"limit {LIBRDKAFKA_MAX_MESSAGE_BYTES}",
            "lower it",
        )
        value = self.kafka.get("message.max.bytes")
        if value is not None and value.isdigit() and int(value) < needed:
            raise ConfigError(
                "kafka.message.max.bytes",
                f"{value} is below the {needed} bytes a raw record of {key} {size} needs (raw "
                "key, header and framing included)",
                f"remove it (the receiver sets message.max.bytes={needed} itself) or lower {key}",
            )
        for prop in ("queue.buffering.max.messages", "queue.buffering.max.kbytes"):
            if prop in self.kafka:
                raise ConfigError(
                    f"kafka.{prop}",
                    "is set by buffer_max_records / buffer_max_bytes",
                    "set those keys instead",
                )
        self.wire_config()  # validates the wire limits, naming the key

    def raw_size_setting(self) -> tuple[str, int]:
        """``(key, bytes)`` of the setting that bounds the largest raw record's value: a run is at
        most ``run_max_bytes`` unless one record alone is larger (up to ``max_record_size``)."""
        if self.run_max_bytes > self.max_record_size:
            return "run_max_bytes", self.run_max_bytes
        return "max_record_size", self.max_record_size

    def ports(self) -> tuple[int, ...]:
        """Every UDP port listened on: ``listen_port`` first, then ``listen_ports``."""
        return (self.listen_port, *self.listen_ports)

    def socket_count(self) -> int:
        """Sockets in all: ``sockets`` per port (and worker processes, with worker_processes)."""
        return len(self.ports()) * self.sockets

    def pubkey_config(self) -> PublicKeyReceiveConfig:
        """The public-key mode's limits, taken from this configuration."""
        return PublicKeyReceiveConfig(
            retire_grace=self.retire_grace,
            hold_datagrams=self.hold_datagrams,
            hold_bytes=self.hold_bytes,
            hold_timeout=self.hold_timeout,
        )

    def wire_config(self) -> WireConfig:
        """The decoder's limits, taken from this configuration."""
        values: dict[str, Any] = {name: getattr(self, name) for name in WIRE_FIELDS}
        return WireConfig(**values)

    def producer_config(self) -> dict[str, str]:
        """librdkafka properties: defaults < ``kafka`` pass-through < pinned and bounded ones."""
        props = dict(DEFAULT_KAFKA)
        props.update(self.kafka)
        props.update(PINNED_KAFKA)
        props["bootstrap.servers"] = self.bootstrap_servers
        # records up to max_record_size must pass librdkafka's own size check (it refuses
        # anything over message.max.bytes, 1 MB by default, before the broker sees it)
        wanted = record_limit(self.raw_size_setting()[1])
        if int(props.get("message.max.bytes", "0") or 0) < wanted:
            props["message.max.bytes"] = str(wanted)
        props["queue.buffering.max.messages"] = str(self.buffer_max_records)
        props["queue.buffering.max.kbytes"] = str(max(1, self.buffer_max_bytes // 1024))
        return props

    def raw_topic_for(self, source_topic: str) -> str:
        """The raw topic a record of ``source_topic`` is written to."""
        return fill_topic(self.raw_topic, source_topic)

    def for_worker(self, index: int) -> ReceiverConfig:
        """This configuration for worker process ``index``: one socket, its own metrics port.

        Workers ``0 .. sockets - 1`` listen on ``listen_port``, the next ``sockets`` on the first
        of ``listen_ports``, and so on.
        """
        metrics = self.metrics_port + index if self.metrics_port else 0
        return dataclasses.replace(
            self,
            listen_port=self.ports()[index // self.sockets],
            listen_ports=(),
            sockets=1,
            worker_processes=False,
            metrics_port=metrics,
        )
