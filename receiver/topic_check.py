"""The raw topic: created when missing, and does it admit what the receiver is configured to
write? (Kafka I/O, blocking; called on an executor thread at start-up.)

:func:`ensure_raw_topic` creates a missing raw topic (``create_raw_topic``) with the
partitions, replication, ``min.insync.replicas`` and ``max.message.bytes`` of the settings, through
``runtime.kafka.create_missing_topics`` (as the dedup creates its topics), before anything looks the
topic up: a producer's metadata request would otherwise let a broker with
``auto.create.topics.enable`` create it with its defaults (one replica, about 1 MB). An existing
topic is left as it is.
The fixed raw topic is ensured at start-up (a refusal stops it); each raw topic of a ``{topic}``
template when its first record arrives (``receiver/kafka_sink.py``; a refusal is logged).
For a template, the topics it can name that exist at start-up are checked then, and a problem
stops the start-up as for the fixed raw topic; one that appears later is checked at its first use
(a problem is logged, an ERROR, and a record it refuses is reported as lost).

Its limits are read with an AdminClient ``describe_configs`` where the credentials allow it; the
rule itself is ``common.topic_limits.size_problem``. A topic whose configuration cannot be read (no
``DescribeConfigs`` permission, not there yet) is not a problem here: the broker still enforces
its limit, and a record it refuses is reported as lost (``delivery_errors``, ranges logged).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from common.errors import ConfigError, KafkaClientError
from common.topic_limits import created_topic_config, size_problem
from receiver.config import ReceiverConfig
from runtime import kafka

log = logging.getLogger(__name__)


def describe_topic(conf: Mapping[str, Any], topic: str, timeout: float) -> dict[str, str] | None:
    """``{setting: value}`` of ``topic`` (defaults included), or None when it cannot be read."""
    try:
        return kafka.topic_config(conf, topic, timeout)
    except KafkaClientError as exc:
        log.warning("cannot read the configuration of topic %s (%s); not checked", topic, exc)
        return None


def raw_topic_problem(config: ReceiverConfig, topic: str) -> str | None:
    """Why ``topic`` cannot take the largest raw record ``config`` may write, or None: a run of
    up to ``run_max_bytes``, or one record of up to ``max_record_size`` (whichever is larger)."""
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka}
    configs = describe_topic(conf, topic, config.metadata_timeout)
    if configs is None:
        return None
    key, size = config.raw_size_setting()
    return size_problem(topic, configs, size, key, both_sides=key == "max_record_size")


def template_topics(template: str, names: Iterable[str]) -> list[str]:
    """The topics among ``names`` that the ``{topic}`` template ``template`` can name, sorted
    (never Kafka's internal ``__`` topics; none for a template that is ``{topic}`` alone, which
    can name any topic of the cluster)."""
    parts = template.split("{topic}")
    if not "".join(parts):
        return []
    pattern = re.compile(".+".join(re.escape(part) for part in parts))
    return sorted(n for n in names if pattern.fullmatch(n) and not n.startswith("__"))


def raw_topic_spec(config: ReceiverConfig, topic: str) -> kafka.TopicSpec:
    """How the receiver creates ``topic``: the settings' partitions and replication, and the
    ``max.message.bytes`` its largest raw record needs."""
    _, size = config.raw_size_setting()
    settings = created_topic_config(size, any_timestamp=False)
    if config.raw_topic_min_insync_replicas != -1:
        settings["min.insync.replicas"] = str(config.raw_topic_min_insync_replicas)
    return kafka.TopicSpec(
        name=topic,
        partitions=config.raw_topic_partitions,
        replication=config.raw_topic_replication,
        config=settings,
    )


def check_template(config: ReceiverConfig) -> list[str]:
    """Start-up checks of a ``{topic}`` template, whose raw topics are made while running, from
    one metadata request: the cluster has ``raw_topic_replication`` brokers (``create_raw_topic``;
    every creation would be refused otherwise; a node that is down but holds replicas counts,
    :func:`runtime.kafka.known_brokers`), and every existing topic the template can name
    admits the largest raw record (as :func:`raw_topic_problem`). A cluster that does not answer,
    or configurations it will not describe, are not an error here (logged: the receiver starts
    and each topic is checked at its first use). Returns the topics checked.

    Raises:
        ConfigError: naming ``raw_topic_replication``, or the raw topic template with every topic
            too small and its ``kafka-configs`` command.
    """
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka}
    try:
        brokers, names = kafka.cluster_metadata(conf, config.metadata_timeout)
    except KafkaClientError as exc:
        log.warning("cannot reach the downstream cluster now (%s); the raw topics of %s are "
                    "checked when their first records arrive", exc, config.raw_topic)  # fmt: skip
        return []
    wanted = config.raw_topic_replication
    if config.create_raw_topic and wanted != -1 and brokers < wanted:
        raise ConfigError(
            "raw_topic_replication",
            f"{wanted} replicas for the raw topics of {config.raw_topic!r},"
            f" but the cluster at {config.bootstrap_servers} has {brokers} broker(s)",
            "set raw_topic_replication (and raw_topic_min_insync_replicas) to at most the "
            "cluster's broker count, e.g. 1 and 1 for a single-broker test cluster",
        )
    found = template_topics(config.raw_topic, names)
    try:
        configs = kafka.topic_configs(conf, found, config.metadata_timeout)
    except KafkaClientError as exc:
        log.warning("cannot read the configuration of the raw topics of %s (%s); each is "
                    "checked when its first record arrives", config.raw_topic, exc)  # fmt: skip
        return []
    key, size = config.raw_size_setting()
    problems = [
        problem
        for name in found
        if (problem := size_problem(name, configs[name], size, key,
                                    both_sides=key == "max_record_size")) is not None
    ]  # fmt: skip
    if problems:
        raise ConfigError(f"raw topic template {config.raw_topic}", "; ".join(problems))
    return found


def ensure_raw_topic(config: ReceiverConfig, topic: str) -> bool:
    """Create ``topic`` if it is missing (``create_raw_topic``); True if this call created it.

    An unreachable or failing-over cluster is not an error here (logged; the receiver starts and
    records wait in its backlog, as for a broker that goes away later).

    Raises:
        ConfigError: the cluster refused to create the topic, naming the setting to change
            (``raw_topic_replication`` for too few brokers) or what to do instead.
    """
    if not config.create_raw_topic:
        return False
    conf = {"bootstrap.servers": config.bootstrap_servers, **config.kafka}
    spec = raw_topic_spec(config, topic)
    try:
        ensured = kafka.create_missing_topics(
            conf,
            [spec],
            timeout=max(30.0, config.metadata_timeout),
            reach_timeout=config.metadata_timeout,
        )
    except KafkaClientError as exc:
        # unreachable, or a broker or controller failing over (a retriable error): not the
        # cluster refusing the topic
        if exc.topic is None or exc.retriable:
            log.warning(
                "cannot create raw topic %s now (%s); created when it is needed", topic, exc
            )
            return False
        if exc.name == "INVALID_REPLICATION_FACTOR":
            raise ConfigError(
                "raw_topic_replication",
                f"{exc}",
                "set raw_topic_replication (and raw_topic_min_insync_replicas) to at most the "
                "cluster's broker count, e.g. 1 and 1 for a single-broker test cluster",
            ) from exc
        raise ConfigError(
            "create_raw_topic",
            f"{exc}",
            f"create it yourself: kafka-topics --bootstrap-server HOST:PORT --create --topic "
            f"{topic} --partitions {spec.partitions} --replication-factor "
            f"{spec.replication} "
            + " ".join(f"--config {k}={v}" for k, v in spec.config.items())
            + ", or allow the receiver's principal to create topics, or set "
            "create_raw_topic = false",
        ) from exc
    if ensured.created:
        log.info(
            "created raw topic %s: %d partitions, replication %s, %s",
            topic,
            spec.partitions,
            spec.replication if spec.replication != -1 else "the broker's default",
            ", ".join(f"{k}={v}" for k, v in spec.config.items()),
        )
    return bool(ensured.created)
