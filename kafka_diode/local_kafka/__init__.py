"""Real Apache Kafka brokers on this host, without Docker, for tests and the demo.

``runtime.maven`` fetches and caches the broker jars and Spark's Kafka connector (Maven Central,
once; offline afterwards); ``broker`` runs a named single-node KRaft broker as a background JVM;
``cli`` is ``kafka-diode local-kafka``. See docs/local-kafka.md.
"""

from __future__ import annotations

from kafka_diode.local_kafka.broker import BrokerState, BrokerStatus, LocalBroker, list_brokers
from runtime.maven import (
    KAFKA_VERSION,
    SPARK_VERSION,
    ensure_kafka_jars,
    spark_connector_jars,
)

__all__ = [
    "KAFKA_VERSION",
    "SPARK_VERSION",
    "BrokerState",
    "BrokerStatus",
    "LocalBroker",
    "ensure_kafka_jars",
    "list_brokers",
    "spark_connector_jars",
]
