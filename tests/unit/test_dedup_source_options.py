"""The options the dedup gives Spark's Kafka source (``dedup/job.py``): a short fetch wait and a
bounded poll by default, and every ``KAFKA_SOURCE_<NAME>`` over the defaults."""

from __future__ import annotations

from dedup.config import from_sources
from dedup.job import SOURCE_FETCH_WAIT_MS, SOURCE_MAX_POLL_RECORDS, source_options

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}


def test_the_source_waits_briefly_for_a_fetch_and_reads_what_it_is_told() -> None:
    options = source_options(from_sources(BASE), ("raw",))
    assert options["kafka.fetch.max.wait.ms"] == str(SOURCE_FETCH_WAIT_MS) == "10"
    # the heap holds a poll per raw partition (tests/integration/test_dedup_heap.py)
    assert options["kafka.max.poll.records"] == str(SOURCE_MAX_POLL_RECORDS) == "32"
    assert options["subscribe"] == "raw"
    assert options["kafka.bootstrap.servers"] == "k:9092"
    assert options["startingOffsets"] == "earliest"
    assert options["includeHeaders"] == "true"


def test_a_kafka_source_option_wins_over_the_default_and_comes_last() -> None:
    env = {
        **BASE,
        "KAFKA_SOURCE_KAFKA_FETCH_MAX_WAIT_MS": "200",
        "KAFKA_SOURCE_KAFKA_MAX_POLL_RECORDS": "500",
        "KAFKA_SOURCE_STARTINGOFFSETS": "latest",
    }
    options = source_options(from_sources(env), ("raw", "control"))
    assert options["kafka.fetch.max.wait.ms"] == "200"
    assert options["kafka.max.poll.records"] == "500"
    assert options["subscribe"] == "raw,control"
    # Spark's options ignore case: the user's spelling is applied after the default's
    names = list(options)
    assert names.index("startingoffsets") > names.index("startingOffsets")
    assert options["startingoffsets"] == "latest"
