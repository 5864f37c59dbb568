"""Does the raw topic admit what the receiver is configured to write? (Kafka I/O, blocking).

Read with an AdminClient ``describe_configs`` where the credentials allow it; the rule itself is
``common.topic_limits.size_problem``. A topic whose configuration cannot be read (no
``DescribeConfigs`` permission, not there yet) is not a problem here: the broker still enforces
its limit, and a record it refuses is reported as lost (``delivery_errors``, ranges logged).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from common.errors import KafkaClientError
from common.topic_limits import size_problem
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
