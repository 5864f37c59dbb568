"""The demo producer's topics: created when missing, checked when present, explained when neither.

``kafka-diode demo produce`` spreads records over ``--partitions`` partitions of each topic. Against
a broker without those topics the first produce used to fail with a raw ``_UNKNOWN_PARTITION``
traceback. ``ensure_topics`` creates missing topics with the requested partitions (replication: the
broker's default), refuses in one line when an existing topic has fewer partitions than requested,
and says in one line what to do when the broker cannot be reached or refuses to create them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

from common.errors import ConfigError, ServiceError
from runtime import kafka

#: librdkafka's own lines (``%3|…|FAIL|…`` per connection attempt, ``%6|…|BGQUEUE|…``) go to a
#: logger of ours instead of the terminal; what matters reaches the user as one ServiceError line.
_LIBRDKAFKA_LOG = logging.getLogger(f"{__name__}.librdkafka")
QUIET: dict[str, Any] = {"log_level": 4, "logger": _LIBRDKAFKA_LOG}
#: Seconds a broker has to answer the first metadata request before it counts as unreachable.
REACH_TIMEOUT_S = 10.0


def _partitions(admin: AdminClient, topics: Sequence[str], timeout: float) -> dict[str, int]:
    """Partition count of each of ``topics`` that exists (with leaders), by name."""
    metadata = admin.list_topics(timeout=timeout)
    out = {}
    for name in topics:
        meta = metadata.topics.get(name)
        if meta is not None and meta.error is None:
            out[name] = len(meta.partitions)
    return out


def ensure_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, *, timeout: float = 30.0
) -> list[str]:
    """Create the missing ``topics`` with ``partitions`` partitions; returns the ones created.

    Raises:
        ConfigError: an existing topic has fewer partitions than ``partitions``.
        ServiceError: the broker cannot be reached, or refuses to create a topic.
    """
    admin = kafka.admin({"bootstrap.servers": bootstrap, **QUIET})
    reach = min(timeout, REACH_TIMEOUT_S)
    try:
        existing = _partitions(admin, topics, reach)
    except KafkaException as exc:
        raise ServiceError(
            f"cannot reach Kafka at {bootstrap} within {reach:.0f} s ({_reason(exc)}): "
            "start the broker or give the right --bootstrap-servers"
        ) from exc
    for name, count in existing.items():
        if count < partitions:
            raise ConfigError(
                "--partitions",
                f"topic {name!r} has {count} partition(s), fewer than the {partitions} requested",
                f"use --partitions {count}, or add partitions to {name!r}",
            )
    missing = [t for t in topics if t not in existing]
    if not missing:
        return []
    futures = admin.create_topics(
        [NewTopic(t, partitions, -1) for t in missing], operation_timeout=timeout
    )
    for name, future in futures.items():
        try:
            future.result(timeout + 5)
        except KafkaException as exc:
            if exc.args and _code(exc) == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # created meanwhile by someone else: checked below
            raise ServiceError(
                f"cannot create topic {name!r} ({_reason(exc)}): create it with {partitions} "
                "partitions (kafka-topics.sh --create), or give --topics of existing ones"
            ) from exc
    _wait_for_leaders(admin, missing, partitions, timeout)
    return missing


def _wait_for_leaders(
    admin: AdminClient, topics: Sequence[str], partitions: int, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout).topics
        ready = all(
            (meta := metadata.get(t)) is not None
            and meta.error is None
            and len(meta.partitions) >= partitions
            and all(p.leader >= 0 for p in meta.partitions.values())
            for t in topics
        )
        if ready:
            return
        if time.monotonic() >= deadline:
            raise ServiceError(
                f"topics {', '.join(topics)} were created but have no leader after "
                f"{timeout:.0f} s: check the broker's log"
            )
        time.sleep(0.1)


def _code(exc: KafkaException) -> Any:
    err = exc.args[0] if exc.args else None
    return err.code() if isinstance(err, KafkaError) else None


def _reason(exc: KafkaException) -> str:
    err = exc.args[0] if exc.args else None
    return err.str() if isinstance(err, KafkaError) else str(exc)
