"""The dedup's own topics: created when missing, and clean topics checked against the link.

Runs on the driver (start-up: the gap, progress and control topics; a fixed clean topic) and in
the write tasks (a templated clean topic the first time a task writes to it; cached per process).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping

from common.errors import KafkaClientError, ServiceError
from common.topic_limits import (
    LONG_MAX,
    TimestampWindow,
    created_topic_config,
    record_limit,
    size_problem,
    timestamp_window,
)
from dedup.fence import WRITE_BATCH_BYTES, base_conf
from dedup.writer_settings import KAFKA_TIMEOUT_S, LIBRDKAFKA_BATCH_BYTES, WriterSettings
from runtime import kafka

log = logging.getLogger(__name__)

#: Clean topics checked at most this many per process (``checked_clean_topic``'s cache).
MAX_CHECKED_TOPICS = 4096


def create_dedup_topics(
    settings: WriterSettings,
    topics: Iterable[str],
    *,
    compact: bool = False,
    partitions: int | None = None,
    config: Mapping[str, str] | None = None,
) -> dict[str, int]:
    """Create those of ``topics`` that do not exist (clean: NEW_TOPIC_PARTITIONS; else 1) and
    wait for their leaders (runtime.kafka.create_missing_topics); ``config`` adds topic settings.
    Returns each topic's partition count (created or found)."""
    if partitions is None:
        partitions = 1 if compact else settings.new_topic_partitions
    config = {
        **created_topic_config(settings.max_record_size, any_timestamp=not compact),
        **({"cleanup.policy": "compact"} if compact else {}),
        **(config or {}),
    }
    specs = [
        kafka.TopicSpec(
            name=t,
            partitions=partitions,
            replication=settings.new_topic_replication,
            config=config,
        )
        for t in topics
    ]
    ensured = kafka.create_missing_topics(base_conf(settings), specs, timeout=KAFKA_TIMEOUT_S)
    for topic in ensured.created:
        log.info("created topic %s (%d partitions)", topic, partitions)
    return dict(ensured.partitions)


def write_batch_bytes(settings: WriterSettings) -> int:
    """The write producers' ``batch.size``: ``WRITE_BATCH_BYTES``, or less where the gap or the
    progress topic admits less (librdkafka has one batch size for every topic it writes; a clean
    topic is refused below ``record_limit(MAX_RECORD_SIZE)`` anyway). Topics kafka-diode
    created take ``record_limit(MAX_RECORD_SIZE)``; one created elsewhere may keep the brokers'
    1 MB, where the dedup keeps librdkafka's own batch size."""
    topics = [settings.gap_topic, settings.progress_topic]
    try:
        configs = kafka.topic_configs(base_conf(settings), topics, KAFKA_TIMEOUT_S)
    except KafkaClientError as exc:
        log.warning("cannot read the configuration of %s (%s)", topics, exc)
        return LIBRDKAFKA_BATCH_BYTES
    return batch_bytes_within(configs, settings.max_record_size)


def batch_bytes_within(configs: Mapping[str, Mapping[str, str]], max_record_size: int) -> int:
    """The batch size every topic of ``configs`` (their ``describe_configs``) admits, at most
    ``WRITE_BATCH_BYTES`` and ``record_limit(max_record_size)``; librdkafka's own where a
    topic's limit is not readable."""
    limits = [WRITE_BATCH_BYTES, record_limit(max_record_size)]
    for config in configs.values():
        value = config.get("max.message.bytes", "")
        if not value.isdigit():
            return LIBRDKAFKA_BATCH_BYTES
        limits.append(int(value))
    return min(limits)


#: (bootstrap servers, clean topic, max_record_size) -> its window, per process: a Python worker
#: runs many write tasks, and each would otherwise ask the broker again for every batch.
_checked: dict[tuple[str, str, int], TimestampWindow] = {}
_checked_lock = threading.Lock()


def checked_clean_topic(settings: WriterSettings, topic: str) -> TimestampWindow:
    """``checked_clean_topics`` of one topic."""
    return checked_clean_topics(settings, [topic])[topic]


def checked_clean_topics(
    settings: WriterSettings, topics: Iterable[str]
) -> dict[str, TimestampWindow]:
    """At first use of clean topics (per process): create those missing (with our settings,
    never by a broker's auto-create), refuse one that cannot take the largest record, learn
    which timestamps each accepts (docs/topics.md "Timestamps"). Topics not checked yet in this
    process are checked together: one creation request and one describe for all (a write task
    of a link with many topics otherwise paid two admin round trips per topic).

    Raises:
        ServiceError: a topic's max.message.bytes is below what MAX_RECORD_SIZE needs.
    """
    wanted = list(dict.fromkeys(topics))
    found: dict[str, TimestampWindow] = {}
    with _checked_lock:
        for topic in wanted:
            window = _checked.get((settings.bootstrap_servers, topic, settings.max_record_size))
            if window is not None:
                found[topic] = window
    missing = [t for t in wanted if t not in found]
    if not missing:
        return found
    create_dedup_topics(settings, missing)
    checked = _check_clean_topics(settings, missing)
    with _checked_lock:
        if len(_checked) + len(checked) > MAX_CHECKED_TOPICS:
            _checked.clear()  # bounded; a topic checked again costs one describe
        for topic, window in checked.items():
            _checked[(settings.bootstrap_servers, topic, settings.max_record_size)] = window
    return found | checked


def _check_clean_topics(settings: WriterSettings, topics: list[str]) -> dict[str, TimestampWindow]:
    try:
        configs = kafka.topic_configs(base_conf(settings), topics, KAFKA_TIMEOUT_S)
    except KafkaClientError as exc:
        log.warning("cannot read the configuration of clean topics %s (%s)", topics, exc)
        return dict.fromkeys(topics, TimestampWindow())
    windows = {}
    for topic in topics:
        problem = size_problem(topic, configs[topic], settings.max_record_size, "MAX_RECORD_SIZE")
        if problem is not None:
            raise ServiceError(f"clean {problem}")
        window = windows[topic] = timestamp_window(configs[topic])
        if not window.unlimited:
            log.warning(
                "clean topic %s does not take every source timestamp (%s): records outside it "
                "are written with the dedup's time and their own in the diode.original-timestamp "
                "header (metric kafka_diode_dedup_timestamps_replaced_total). To keep every "
                "timestamp: kafka-configs --alter --entity-type topics --entity-name %s "
                "--add-config message.timestamp.after.max.ms=%d,message.timestamp.before.max.ms=%d",
                topic,
                window.describe(),
                topic,
                LONG_MAX,
                LONG_MAX,
            )
    return windows
