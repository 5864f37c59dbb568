"""Configuration of the dedup job, validated once at start-up.

Operators set the job through the environment names they already know (docs/dedup.md "Settings"):
``WINDOW_SIZE``, ``MAX_WINDOWS``, ``RAW_TOPICS``, ``CLEAN_TOPIC``, ``GAP_TOPIC``,
``BOOTSTRAP_SERVERS``, ``STATE_DIR_CONFIG``, ``GAP_EMIT_INTERVAL_SEC``, ``PERSIST_INTERVAL_MS``,
``SPARK_MASTER`` and the others below: each field's environment variable is its name in upper
case, **without a prefix**. Every field also has a ``--flag``; flags override the environment.

Three pass-through tables carry settings this module does not interpret:

- ``SPARK_CONF_<NAME>`` -> Spark configuration ``<name>`` (``_`` read as ``.``; an all-upper-case
  name is lower-cased, so ``SPARK_CONF_SPARK_EXECUTOR_MEMORY=4g`` sets ``spark.executor.memory``;
  write mixed case to keep it: ``SPARK_CONF_spark_executor_memoryOverhead=1g``).
- ``KAFKA_CONF_<NAME>`` -> librdkafka property for the dedup's own Kafka clients (the transactional
  writers, the marker and state readers, the admin client and ``kafka-diode gaps``),
  e.g. ``KAFKA_CONF_SECURITY_PROTOCOL=SASL_SSL``.
- ``KAFKA_SOURCE_<NAME>`` -> option of Spark's Kafka source, e.g.
  ``KAFKA_SOURCE_KAFKA_SECURITY_PROTOCOL=SASL_SSL`` sets ``kafka.security.protocol``; the
  retention probe copies the options librdkafka shares with Java
  (``dedup.raw_position.SHARED_SOURCE_OPTIONS``).

Guarantee: a ``DedupConfig`` that exists is internally consistent; every refusal is a
``ConfigError`` naming the variable (as the operator wrote it) and the fix.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from common import settings
from common.errors import ConfigError
from common.raw_topic import TOPIC_FIELD, fill_topic
from common.topic_limits import RECORD_OVERHEAD, record_limit
from dedup import layouts

#: Kafka topic names: at most 249 characters of ``[a-zA-Z0-9._-]`` (Kafka's own rule).
_TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
PASS_THROUGH = {
    "spark_conf": "SPARK_CONF_",
    "kafka_conf": "KAFKA_CONF_",
    "kafka_source": "KAFKA_SOURCE_",
}
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
#: ``DIRECT_READER``'s choices: the tasks read their offset ranges, or Spark's Kafka source does.
DIRECT_READERS = ("librdkafka", "spark")
#: Bounds that keep one micro-batch and one state value within memory a single host has.
MAX_WINDOW_SIZE = 1 << 30
MAX_MAX_WINDOWS = 1 << 20


@dataclass(frozen=True, kw_only=True)
class DedupConfig:
    """Every setting of ``kafka-diode dedup``; environment name = field name in upper case."""

    raw_topics: tuple[str, ...]
    """Raw topic(s) the receiver(s) write, comma-separated; several are merged (one per chain,
    docs/sender.md "Chains"; chains whose receivers all write one raw topic name it alone)."""
    bootstrap_servers: str
    """Downstream Kafka bootstrap servers (host:port, comma-separated)."""
    state_dir_config: str
    """Checkpoint location of the query (offsets, commit log, RocksDB state): a local path or a
    Hadoop URI (hdfs://, s3a://) that every Spark node can reach. Keep it: a new or deleted one
    makes the job re-read the raw topic(s) from the earliest retained offset with empty state and
    a new fence, so everything still retained is delivered to the clean topic(s) AGAIN. To drop
    one partition's state use 'kafka-diode dedup reset'; to start over, also use new clean
    topics (docs/dedup.md "Starting over")."""
    clean_topic: str = "clean.{topic}"
    """Clean topic: a fixed name, or a template where {topic} is the source topic name."""
    gap_topic: str = "kafka-diode.gaps"
    """Gap topic (compacted; one JSON record per gap state, key <topic>:<partition>:<first>)."""
    progress_topic: str = "kafka-diode.dedup.progress"
    """Topic of the writer's per-batch progress markers (the effectively-once fence)."""
    control_topic: str = "kafka-diode.dedup.control"
    """Topic the job also reads for operator commands (kafka-diode dedup reset)."""
    state_layout: str = "auto"
    """Layout of a NEW checkpoint (an existing one keeps its own): direct (each raw
    partition is detected, written and keeps its detectors in STATE_TOPIC, in one transaction;
    no shuffle, no stateful operator; one raw topic, whose partition count is then fixed),
    buckets (Spark's stateful step, RocksDB state; any number of raw topics), or auto: direct
    for one raw topic (chains too, when every chain's receiver writes it), buckets for several
    (docs/dedup.md "The direct layout")."""
    direct_reader: str = "librdkafka"
    """How the direct layout's tasks get the raw records: librdkafka (Spark plans each batch's
    offset ranges, each task reads its own range with librdkafka; no payload passes through
    Spark's JVM) or spark (Spark's Kafka source reads them in the JVM). Either reads on from a
    checkpoint the other wrote, but spark only without transaction groups (DIRECT_TRANSACTIONS;
    docs/dedup.md "The direct layout")."""
    direct_transactions: int = 0
    """Transactions per micro-batch of a NEW direct checkpoint (an existing one keeps its own):
    raw partition p commits with the others of group p mod this, one fence and one commit per
    group instead of per raw partition, and a batch runs one task per group. 0 = Spark's
    default parallelism at the first start (local[N]: N); a value of at least the raw topic's
    partition count, or DIRECT_READER=spark, commits each raw partition alone. It caps the
    tasks a batch runs at once for the checkpoint's life (docs/dedup.md "The direct layout")."""
    state_topic: str = "kafka-diode.dedup.state"
    """The direct layout's state topic (compacted, one partition per raw partition; created by
    the job)."""
    window_size: int = 65_536
    """Offsets per sliding window of the gap detector (windows are aligned to multiples of it)."""
    max_windows: int = 1_024
    """Windows kept per source partition; the oldest is evicted (its gaps reported) beyond it."""
    max_expired_gaps: int = 100_000
    """Gap ranges remembered below the oldest window (a late resend into them is still delivered
    once); beyond it the oldest are reported expired and forgotten."""
    max_state_bytes: int = 64 * 1024 * 1024
    """Memory budget of one partition's detector state; beyond it the oldest windows are evicted
    early (their gaps reported) and a warning names this setting. Keep it below ~256 MiB. The
    detectors of one bucket share 192 MiB besides (docs/dedup.md "State layout")."""
    gap_emit_interval_sec: float = 10.0
    """Seconds between gap scans per partition; a gap seen by two consecutive scans is reported."""
    persist_interval_ms: int = 1_000
    """Trigger interval: one micro-batch (and one state checkpoint) at most every this many ms."""
    spark_master: str = "local[*]"
    """Spark master URL; ignored when started by spark-submit (its --master wins). A local
    master without a count of task attempts gets 4 (local[*] runs as local[*,4]): a task that
    fails on a transient Kafka error is retried, as on a cluster; local[N,1] fails at once."""
    jvm_class_archive_dir: str = "auto"
    """Where the driver JVM's class-data archive is kept, when the dedup starts that JVM itself
    (not under spark-submit): auto (systemd's CACHE_DIRECTORY/jvm-classes, else
    KAFKA_DIODE_CACHE/jvm-classes), a directory, or off. A start without an archive has the JVM
    write one at its next clean stop (~150 MB; two are kept); a start with one maps Spark's
    classes instead of loading them, seconds sooner (docs/dedup-internals.md "The driver JVM's
    class archive")."""
    shuffle_partitions: int = 0
    """spark.sql.shuffle.partitions of the stateful step (state partitions = write tasks per
    batch); 0 = half the driver's cores, at least 1 (each task keeps two Python workers busy at
    once). Fixed by the first run of a checkpoint (Spark keeps it in the checkpoint)."""
    max_offsets_per_trigger: int = 10_000
    """Most raw records read per micro-batch. A raw record is a run (up to the receiver's
    ``run_max_bytes``, 64 KiB by default, or one larger record) or, in a v1 raw topic, one
    record. It bounds the payload of a batch (10,000 runs of 64 KiB: 640 MB at most) and so the
    records of one transaction, and it caps the input rate: a receiver writes up to 50 runs a
    second per busy source partition, so a link spread over many partitions needs about 50 x
    partitions x the batch time (docs/operations.md "Many source partitions"). Links of records
    above 64 KiB on the buckets layout: lower it so that it times the record size stays within
    about half the heap (the direct layout streams each raw partition: ~600 MB of 16 MiB records
    pass in one batch at this default, tests/integration/test_dedup_heap.py); for the time a
    batch's transactions take, docs/operations.md "Known limitations". Raise it while a v1
    backlog drains (docs/dedup.md "Upgrading from layout v1")."""
    arrow_max_records_per_batch: int = 100_000
    """Rows per Arrow batch between the JVM and Python (about 100k is fastest here)."""
    fail_on_data_loss: bool = False
    """Stop the query when raw records were deleted by retention before being read. Off: the
    read skips them (counted; they become gaps if the sender never resends them). A payload is
    read once, by the task that writes it (or by Spark's source, whose rows the task takes), so
    nothing read can vanish later."""
    transactional_id: str | None = None
    """transactional.id of the writer; default derived from STATE_DIR_CONFIG. One per checkpoint:
    two running instances with the same one fence each other (the older fails)."""
    max_record_size: int = 16 * 1024 * 1024
    """Largest record (key + value + headers) the link carries: the sender's and receiver's
    max_record_size. The writer's producer is sized for it; clean topics the job creates admit
    it; an existing clean topic that does not stops the job with an error naming its
    max.message.bytes (docs/operations.md "Large records"). In local mode with
    DIRECT_READER=spark it also sizes the JVM's heap: ~9 copies of the record per task at once
    (docs/dedup.md "Settings")."""
    new_topic_partitions: int = 1
    """Partitions of clean topics the job creates when missing (gap/progress/control get 1)."""
    new_topic_replication: int = -1
    """Replication factor of topics the job creates; -1 = the broker's default."""
    metrics_port: int = 0
    """Port of the Prometheus endpoint (/metrics); 0 = off."""
    metrics_addr: str = "127.0.0.1"
    """Address the Prometheus endpoint binds."""
    log_level: str = "INFO"
    """DEBUG, INFO, WARNING or ERROR (Spark's JVM logging: SPARK_LOG_LEVEL, default WARN)."""
    log_json: bool = False
    """Log one JSON object per line (--log-json alone means true)."""
    spark_conf: dict[str, str] = field(default_factory=dict)
    """Extra Spark settings (SPARK_CONF_<NAME> or --spark-conf name=value)."""
    kafka_conf: dict[str, str] = field(default_factory=dict)
    """Extra librdkafka properties of the dedup's Kafka clients: writer, fence reader, retention
    probe, admin (KAFKA_CONF_<NAME>)."""
    kafka_source: dict[str, str] = field(default_factory=dict)
    """Extra options of Spark's Kafka source (KAFKA_SOURCE_<NAME>; kafka.fetch.max.wait.ms is 10
    and kafka.max.poll.records 32 unless set here); the retention probe copies
    kafka.security.protocol, kafka.sasl.mechanism, kafka.isolation.level and the other options
    librdkafka shares with Java (KAFKA_CONF_<NAME> wins)."""

    def __post_init__(self) -> None:
        if not self.raw_topics:
            raise ConfigError("RAW_TOPICS", "is empty", "name at least one raw topic, e.g. raw")
        for topic in (*self.raw_topics, self.gap_topic, self.progress_topic, self.control_topic):
            if not _TOPIC_RE.match(topic):
                raise ConfigError(
                    "RAW_TOPICS/GAP_TOPIC/PROGRESS_TOPIC/CONTROL_TOPIC",
                    f"{topic!r} is not a valid Kafka topic name",
                    "use 1-249 characters of letters, digits, '.', '_' and '-'",
                )
        probe = fill_topic(self.clean_topic, "x")
        if "{" in probe or "}" in probe or not _TOPIC_RE.match(probe):
            raise ConfigError(
                "CLEAN_TOPIC",
                f"{self.clean_topic!r} is neither a topic name nor a template",
                "use a name such as clean, or a template with {topic}, e.g. clean.{topic}",
            )
        outputs = {self.clean_topic, self.gap_topic, self.progress_topic}
        if len(outputs) != 3 or outputs & set(self.raw_topics) or self.control_topic in outputs:
            raise ConfigError(
                "CLEAN_TOPIC/GAP_TOPIC/PROGRESS_TOPIC",
                "raw, clean, gap, progress and control topics must all differ",
                "give each its own name",
            )
        self._check_layout()
        if self.clean_topic == TOPIC_FIELD and self.control_topic in self.raw_topics:
            raise ConfigError("CONTROL_TOPIC", "is also a raw topic", "give it its own name")
        if not self.bootstrap_servers.strip():
            raise ConfigError("BOOTSTRAP_SERVERS", "is empty", "set host:port of a Kafka broker")
        if not self.state_dir_config.strip():
            raise ConfigError(
                "STATE_DIR_CONFIG", "is empty", "set a checkpoint directory, e.g. /var/lib/dedup"
            )
        _check_range("WINDOW_SIZE", self.window_size, 1, MAX_WINDOW_SIZE)
        _check_range("MAX_WINDOWS", self.max_windows, 1, MAX_MAX_WINDOWS)
        _check_range("MAX_EXPIRED_GAPS", self.max_expired_gaps, 0, 2**31)
        _check_range("MAX_STATE_BYTES", self.max_state_bytes, 4096, 2**40)
        if not 0.1 <= self.gap_emit_interval_sec <= 86_400:
            raise ConfigError(
                "GAP_EMIT_INTERVAL_SEC",
                f"is {self.gap_emit_interval_sec}",
                "use 0.1 to 86400 seconds",
            )
        _check_range("PERSIST_INTERVAL_MS", self.persist_interval_ms, 0, 3_600_000)
        _check_range("SHUFFLE_PARTITIONS", self.shuffle_partitions, 0, 100_000)
        _check_range("DIRECT_TRANSACTIONS", self.direct_transactions, 0, 100_000)
        _check_range("MAX_OFFSETS_PER_TRIGGER", self.max_offsets_per_trigger, 1, 50_000_000)
        _check_range("ARROW_MAX_RECORDS_PER_BATCH", self.arrow_max_records_per_batch, 1, 10_000_000)
        _check_range("NEW_TOPIC_PARTITIONS", self.new_topic_partitions, 1, 100_000)
        _check_range("MAX_RECORD_SIZE", self.max_record_size, 1, 1_000_000_000 - RECORD_OVERHEAD)
        needed = record_limit(self.max_record_size)
        for prop, least in (
            ("message.max.bytes", needed),  # the writer's producer
            ("receive.message.max.bytes", needed + 512),  # the dedup's consumers' responses
        ):
            value = self.kafka_conf.get(prop, "")
            if value.isdigit() and int(value) < least:
                raise ConfigError(
                    "KAFKA_CONF_" + prop.upper().replace(".", "_"),
                    f"{value} is below the {least} bytes a record of MAX_RECORD_SIZE "
                    f"{self.max_record_size} needs",
                    "remove it (the dedup sizes its clients itself) or lower MAX_RECORD_SIZE",
                )
        if self.new_topic_replication == 0 or self.new_topic_replication < -1:
            raise ConfigError("NEW_TOPIC_REPLICATION", "must be -1 or at least 1", "use -1 or 3")
        _check_range("METRICS_PORT", self.metrics_port, 0, 65_535)
        if self.log_level.upper() not in LOG_LEVELS:
            raise ConfigError("LOG_LEVEL", f"is {self.log_level!r}", "use DEBUG/INFO/WARNING/ERROR")
        if not self.jvm_class_archive_dir.strip():
            raise ConfigError(
                "JVM_CLASS_ARCHIVE_DIR", "is empty", "use auto, off or a writable directory"
            )
        if not self.spark_master.strip():
            raise ConfigError("SPARK_MASTER", "is empty", "use local[*] or spark://host:7077")
        if self.transactional_id is not None and not self.transactional_id.strip():
            raise ConfigError("TRANSACTIONAL_ID", "is empty", "unset it to derive one")
        for key in self.spark_conf:
            if not key.startswith("spark."):
                raise ConfigError(
                    "SPARK_CONF_" + key.upper().replace(".", "_"),
                    f"{key!r} is not a Spark setting (Spark ignores names not starting spark.)",
                    f"did you mean SPARK_CONF_SPARK_{key.upper().replace('.', '_')}?",
                )
        for key in ("transactional.id", "enable.idempotence", "isolation.level"):
            if key in self.kafka_conf:
                raise ConfigError(
                    "KAFKA_CONF_" + key.upper().replace(".", "_"),
                    "is set by the writer itself",
                    "remove it (use TRANSACTIONAL_ID for the transactional id)",
                )

    def _check_layout(self) -> None:
        if not _TOPIC_RE.match(self.state_topic):
            raise ConfigError(
                "STATE_TOPIC",
                f"{self.state_topic!r} is not a valid Kafka topic name",
                "use 1-249 characters of letters, digits, '.', '_' and '-'",
            )
        others = {*self.raw_topics, self.gap_topic, self.progress_topic, self.control_topic}
        if self.state_topic in others or self.state_topic == self.clean_topic:
            raise ConfigError(
                "STATE_TOPIC", "is also another of the job's topics", "give it its own name"
            )
        layouts.check_choice(self.state_layout, self.raw_topics, self.kafka_source)
        if self.direct_reader not in DIRECT_READERS:
            raise ConfigError(
                "DIRECT_READER",
                f"is {self.direct_reader!r}",
                "use librdkafka (the default) or spark",
            )

    # -- derived values ------------------------------------------------------------------------

    @property
    def new_state_layout(self) -> layouts.Layout:
        """The layout a new checkpoint gets: ``STATE_LAYOUT``, with ``auto`` resolved
        (``dedup.layouts.new_layout``)."""
        return layouts.new_layout(self.state_layout, self.raw_topics, self.kafka_source)

    def clean_topic_for(self, source_topic: str) -> str:
        """The clean topic of records from ``source_topic``."""
        return fill_topic(self.clean_topic, source_topic)

    @property
    def writer_transactional_id(self) -> str:
        """The writer's transactional.id: configured, or stable per checkpoint location."""
        if self.transactional_id:
            return self.transactional_id
        digest = hashlib.sha256(self.state_dir_config.encode()).hexdigest()[:16]
        return f"kafka-diode-dedup-{digest}"

    def effective_shuffle_partitions(self, cores: int | None = None) -> int:
        """``shuffle_partitions``, or half the driver's cores (``cores``, default: this host's)
        when it is 0.

        Half, because a state partition's task runs two Python workers at once: the stateful
        step's, streaming into the write task's. One task per core gave a 2-core dedup four
        workers and no more throughput than one task with two (docs/benchmarks.md "Dedup").
        """
        if self.shuffle_partitions:
            return self.shuffle_partitions
        host = os.cpu_count() if cores is None else cores
        return max(1, (host or 1) // 2)


def _check_range(name: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(name, f"is {value}", f"use a whole number from {low} to {high}")


def env_var(field_name: str) -> str:
    """The environment variable of a field (its name in upper case, no prefix)."""
    return field_name.upper()


#: The operators' environment variable of every key: the key in upper case, no prefix.
ENV_NAMES = {
    env_var(f.name): f.name for f in dataclasses.fields(DedupConfig) if f.name not in PASS_THROUGH
}
ENV_TABLES = {prefix: name for name, prefix in PASS_THROUGH.items()}
#: Variables the dedup reads besides its keys (dedup/job.py: the JVM's log level).
OTHER_ENV = ("SPARK_LOG_LEVEL",)
#: Spark's own variables that start like a pass-through table and are not a setting of it
#: (SPARK_CONF_DIR: where spark-submit finds spark-defaults.conf).
NOT_SETTINGS = ("SPARK_CONF_DIR",)


def check_environment(env: Mapping[str, str]) -> None:
    """Refuse a variable that looks like a typo of one of the dedup's names.

    The rule (``common.settings.check_env_names``, docs/configuration.md): a variable that is
    not one of the names above but within two edits of one (``WINDOW_SIZ``, ``RAW_TOPIC``), or
    whose leading words are within two edits of ``SPARK_CONF_``, ``KAFKA_CONF_`` or
    ``KAFKA_SOURCE_`` (``KAFKA_CNF_SECURITY_PROTOCOL``).

    Raises:
        ConfigError: naming the variable and the name it probably meant.
    """
    settings.check_env_names(
        env,
        [*ENV_NAMES, *OTHER_ENV],
        table_prefixes=list(ENV_TABLES),
        ignore=NOT_SETTINGS,
    )


def _settings_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` checked for typos, without the variables that only look like settings."""
    check_environment(env)
    return {var: value for var, value in env.items() if var not in NOT_SETTINGS}


def from_sources(
    env: Mapping[str, str],
    flags: argparse.Namespace | Mapping[str, Any] | None = None,
    file_values: Mapping[str, Any] | None = None,
) -> DedupConfig:
    """Build the configuration: defaults < ``--config`` file < environment < flags.

    The same mechanism as every command (``common.settings.build``), with the operators'
    variable names (``ENV_NAMES``, ``ENV_TABLES``) instead of a prefix; a variable that looks
    like a typo of one of them is refused (``check_environment``).

    Raises:
        ConfigError: naming the environment variable or flag at fault, and the fix.
    """
    return settings.build(
        DedupConfig,
        file_values=file_values,
        env=_settings_env(env),
        flags=flags,
        env_names=ENV_NAMES,
        env_tables=ENV_TABLES,
    )


@dataclass(frozen=True, kw_only=True)
class DedupToolConfig:
    """What ``dedup reset`` and ``gaps`` read of the dedup's settings, under the same names, so
    they run from the dedup's environment file."""

    bootstrap_servers: str
    """BOOTSTRAP_SERVERS: downstream Kafka, host:port[,...]."""
    gap_topic: str = DedupConfig.gap_topic
    """GAP_TOPIC: the dedup's gap topic."""
    control_topic: str = DedupConfig.control_topic
    """CONTROL_TOPIC: where ``dedup reset`` writes its reset record (buckets layout)."""
    raw_topics: tuple[str, ...] = ()
    """RAW_TOPICS: the dedup's raw topic(s); a direct checkpoint's reset goes into the first."""
    state_dir_config: str = ""
    """STATE_DIR_CONFIG: the dedup's checkpoint, whose layout file says where a reset goes (a
    local path; for a Hadoop URI pass --raw-topic to reset a direct checkpoint)."""
    kafka_conf: dict[str, str] = field(default_factory=dict)
    """KAFKA_CONF_<NAME>: librdkafka properties of the client."""
    log_level: str = "INFO"
    """LOG_LEVEL."""
    log_json: bool = False
    """LOG_JSON."""

    def __post_init__(self) -> None:
        if not self.bootstrap_servers.strip():
            raise ConfigError(
                "BOOTSTRAP_SERVERS", "is empty", "set BOOTSTRAP_SERVERS or --bootstrap-servers"
            )


def tool_config(
    env: Mapping[str, str], flags: argparse.Namespace | Mapping[str, Any] | None = None
) -> DedupToolConfig:
    """``DedupToolConfig`` from the environment (the dedup's names) and flags.

    The environment is checked for typos of the dedup's names (``check_environment``): the
    tools read the dedup's environment file.

    Raises:
        ConfigError: naming the variable or flag at fault (``BOOTSTRAP_SERVERS`` when missing).
    """
    names = {f.name for f in dataclasses.fields(DedupToolConfig)}
    return settings.build(
        DedupToolConfig,
        env=_settings_env(env),
        flags=flags,
        env_names={var: name for var, name in ENV_NAMES.items() if name in names},
        env_tables={PASS_THROUGH["kafka_conf"]: "kafka_conf"},
    )


def environment_help() -> str:
    """Every environment variable with its meaning and default, for ``--help``."""
    docs = settings.field_docs(DedupConfig)
    lines = ["environment (flags of the same name override):"]
    for f in dataclasses.fields(DedupConfig):
        name = PASS_THROUGH.get(f.name, env_var(f.name))
        if f.name in PASS_THROUGH:
            name += "<NAME>"
        default = settings._default_text(f)
        lines.append(f"  {name}  [default: {default}]")
        lines.append(f"      {docs.get(f.name, '')}")
    return "\n".join(lines)
