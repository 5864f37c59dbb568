"""The one place that builds Kafka clients and turns librdkafka's errors into ours.

Every component asks here for a :func:`producer`, :func:`consumer` or :func:`admin`: a property
the client refuses becomes a :class:`~common.errors.ConfigError` naming it, at start-up, instead
of a bare ``KafkaException`` wherever the client happened to be built. :func:`error` maps a
``KafkaException``/``KafkaError`` met later to :class:`~common.errors.KafkaClientError` with
librdkafka's error name and retriable flag. :func:`read_to_end` reads a (compacted) topic from its
beginning to its current end, the way ``gaps`` and ``bundle`` read the gap topic.

Importable inside Spark executors (the dedup's writer runs there): no asyncio, no event loop.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    ConfigResource,
    ResourceType,
)

from common.errors import ConfigError, KafkaClientError, ServiceError

#: The configuration key a refused client property is reported under (operators set client
#: properties through each command's ``kafka`` table or ``*KAFKA_CONF_*`` variables).
CLIENT_CONF_KEY = "kafka"
_C = TypeVar("_C")


def _built(cls: Callable[[dict[str, Any]], _C], conf: Mapping[str, Any], key: str) -> _C:
    try:
        return cls(dict(conf))
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(
            key, f"the Kafka client refused its configuration: {_text(exc)}", "fix or remove it"
        ) from exc


def producer(conf: Mapping[str, Any], *, key: str = CLIENT_CONF_KEY) -> Producer:
    """A ``Producer`` over ``conf``; ``key`` names the setting a refusal is reported under.

    Raises:
        ConfigError: librdkafka refused a property (unknown name, invalid value).
    """
    return _built(Producer, conf, key)


def consumer(conf: Mapping[str, Any], *, key: str = CLIENT_CONF_KEY) -> Consumer:
    """A ``Consumer`` over ``conf`` (see :func:`producer`)."""
    return _built(Consumer, conf, key)


def admin(conf: Mapping[str, Any], *, key: str = CLIENT_CONF_KEY) -> AdminClient:
    """An ``AdminClient`` over ``conf`` (see :func:`producer`)."""
    return _built(AdminClient, conf, key)


def _text(exc: BaseException) -> str:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return str(exc.args[0].str())
    return str(exc)


def error(exc: KafkaException | KafkaError, doing: str) -> KafkaClientError:
    """``exc`` (raised or reported while ``doing``) as our exception, to ``raise ... from exc``."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return KafkaClientError(
            f"{doing}: {err.str()}", name=err.name(), retriable=bool(err.retriable())
        )
    return KafkaClientError(f"{doing}: {exc}", name="", retriable=False)


def topic_config(conf: Mapping[str, Any], topic: str, timeout: float) -> dict[str, str]:
    """``{setting: value}`` of ``topic`` as the broker applies it (defaults included).

    Raises:
        KafkaClientError: the broker did not answer, or the topic cannot be described.
    """
    client = admin(conf)
    resource = ConfigResource(ResourceType.TOPIC, topic)
    try:
        entries = client.describe_configs([resource], request_timeout=timeout)[resource].result(
            timeout
        )
    except KafkaException as exc:
        raise error(exc, f"reading the configuration of topic {topic}") from exc
    return {name: entry.value for name, entry in entries.items() if entry.value is not None}


def read_to_end(
    conf: Mapping[str, Any], topic: str, *, timeout: float, purpose: str
) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed record of ``topic`` from its beginning to its end now, as ``(key, value)``.

    Reads with a throwaway group id and never commits, so no consumer group moves; ``purpose``
    names the group (``kafka-diode-<purpose>-<random>``) for the broker's logs.

    Raises:
        ConfigError: the client refused ``conf``.
        ServiceError: the broker does not answer, the topic is missing, or the end is not reached
            within ``timeout`` seconds.
    """
    props: dict[str, Any] = {
        "group.id": f"kafka-diode-{purpose}-{uuid.uuid4().hex}",  # never committed
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "isolation.level": "read_committed",
        "auto.offset.reset": "earliest",
        **conf,
    }
    client = consumer(props)
    out: list[tuple[bytes | None, bytes | None]] = []
    try:
        try:
            meta = client.list_topics(topic, timeout=min(timeout, 15.0)).topics.get(topic)
        except KafkaException as exc:
            raise error(exc, "Kafka did not answer") from exc
        if meta is None or meta.error is not None or not meta.partitions:
            raise ServiceError(f"topic {topic!r} does not exist")
        pending: set[int] = set()
        parts = []
        for p in sorted(meta.partitions):
            tp = TopicPartition(topic, p, OFFSET_BEGINNING)
            low, high = client.get_watermark_offsets(tp, timeout=min(timeout, 15.0))
            if high > low:
                pending.add(p)
                parts.append(tp)
        if parts:
            client.assign(parts)
        deadline = time.monotonic() + timeout
        while pending:
            if time.monotonic() > deadline:
                raise ServiceError(
                    f"reading {topic}: partitions {sorted(pending)} did not reach their"
                    f" end within {timeout:.0f} s"
                )
            for msg in client.consume(10_000, 0.5):
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        pending.discard(msg.partition() or 0)
                        continue
                    raise error(err, f"reading {topic}")
                out.append((_as_bytes(msg.key()), _as_bytes(msg.value())))
    finally:
        client.close()
    return out


def _as_bytes(data: str | bytes | None) -> bytes | None:
    return data.encode() if isinstance(data, str) else data
