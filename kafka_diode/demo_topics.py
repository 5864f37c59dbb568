"""The demo producer's topics: created when missing, checked when present, explained when neither.

``kafka-diode demo produce`` spreads records over ``--partitions`` partitions of each topic. Against
a broker without those topics the first produce used to fail with a raw ``_UNKNOWN_PARTITION``
traceback. ``create_demo_topics`` creates missing topics with the requested partitions (replication:
the broker's default), refuses in one line when an existing topic has fewer partitions than
requested, and says in one line what to do when the broker cannot be reached or refuses to create
them.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from common.errors import ConfigError, KafkaClientError, ServiceError
from runtime import kafka

#: librdkafka's own lines (``%3|…|FAIL|…`` per connection attempt, ``%6|…|BGQUEUE|…``) go to a
#: logger of ours instead of the terminal; what matters reaches the user as one ServiceError line.
_LIBRDKAFKA_LOG = logging.getLogger(f"{__name__}.librdkafka")
QUIET: dict[str, Any] = {"log_level": 4, "logger": _LIBRDKAFKA_LOG}
#: Seconds a broker has to answer the first metadata request before it counts as unreachable.
REACH_TIMEOUT_S = 10.0


def create_demo_topics(
    bootstrap: str, topics: Sequence[str], partitions: int, *, timeout: float = 30.0
) -> list[str]:
    """Create the missing ``topics`` with ``partitions`` partitions; returns the ones created.

    Raises:
        ConfigError: an existing topic has fewer partitions than ``partitions``.
        ServiceError: the broker cannot be reached, or refuses to create a topic.
    """
    specs = [kafka.TopicSpec(name=t, partitions=partitions) for t in topics]
    try:
        ensured = kafka.create_missing_topics(
            {"bootstrap.servers": bootstrap, **QUIET},
            specs,
            timeout=timeout,
            reach_timeout=REACH_TIMEOUT_S,
        )
    except KafkaClientError as exc:
        if exc.topic is None:
            raise ServiceError(
                f"{exc}: start the broker or give the right --bootstrap-servers"
            ) from exc
        raise ServiceError(
            f"{exc}: create it with {partitions} partitions (kafka-topics.sh --create), or "
            "give --topics of existing ones"
        ) from exc
    for name, count in ensured.partitions.items():
        if count < partitions:
            raise ConfigError(
                "--partitions",
                f"topic {name!r} has {count} partition(s), fewer than the {partitions} requested",
                f"use --partitions {count}, or add partitions to {name!r}",
            )
    return list(ensured.created)
