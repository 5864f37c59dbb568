"""Shared, pure pieces of kafka-diode: the wire protocol, errors, configuration helpers.

Nothing in this package opens a socket, talks to Kafka or Spark, starts an event loop or reads the
clock by itself (docs/design.md, "A sans-IO core"); ``tests/unit/test_purity.py`` enforces it.
"""
