"""``kafka-diode dedup`` command line without Spark: logging options, help text, stopping."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError
from py4j.protocol import Py4JNetworkError

from common.errors import KafkaClientError
from dedup import cli, runner
from dedup.batch_driver import TransactionalBatchWriter
from dedup.config import from_sources
from runtime import kafka

BASE = {"RAW_TOPICS": "raw", "BOOTSTRAP_SERVERS": "k:9092", "STATE_DIR_CONFIG": "/var/lib/d"}


def flags(*argv: str) -> Any:
    return cli._parser("dedup").parse_args(list(argv))


@pytest.mark.parametrize(
    ("env", "argv", "level", "json_format"),
    [
        ({}, (), "INFO", False),
        ({"LOG_LEVEL": "DEBUG", "LOG_JSON": "true"}, (), "DEBUG", True),
        ({}, ("--log-json",), "INFO", True),  # alone means true
        ({"LOG_JSON": "true"}, ("--log-json", "false"), "INFO", False),  # flags win
        ({}, ("--json-logs", "--log-level", "warning"), "warning", True),  # the old flag
    ],
)
def test_logging_options_like_the_other_components(
    env: dict[str, str], argv: tuple[str, ...], level: str, json_format: bool
) -> None:
    cfg = from_sources({**BASE, **env}, flags(*argv))
    assert (cfg.log_level, cfg.log_json) == (level, json_format)


def test_a_bad_log_level_is_a_configuration_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in BASE.items():
        monkeypatch.setenv(name, value)
    assert cli.main(["--check-config", "--log-level", "LOUD"], prog="dedup") == cli.EXIT_CONFIG
    assert "LOG_LEVEL" in capsys.readouterr().err


def test_help_names_the_logging_options_and_hides_the_old_flag() -> None:
    text = cli._parser("dedup").format_help()
    assert "--log-json" in text
    assert "--log-level" in text
    assert "LOG_JSON" in text
    assert "--json-logs" not in text


def test_help_says_what_a_new_checkpoint_really_does() -> None:
    text = " ".join(cli._parser("dedup").format_help().split())
    assert "Deleting it starts over" not in text
    assert "AGAIN" in text
    assert "dedup reset" in text


class GoneSpark:
    """A SparkSession whose JVM has exited: py4j cannot connect any more."""

    def stop(self) -> None:
        raise ConnectionRefusedError(111, "Connection refused")


class GoneQuery:
    """A query whose JVM exits once a stop was requested (systemd signalled the whole group)."""

    def __init__(self, stop: threading.Event) -> None:
        self.stop_event = stop

    @property
    def isActive(self) -> bool:
        if self.stop_event.is_set():
            raise Py4JNetworkError("An error occurred while trying to connect to the Java server")
        return True

    @property
    def status(self) -> dict[str, Any]:
        raise Py4JNetworkError("An error occurred while trying to connect to the Java server")

    def stop(self) -> None:
        raise Py4JNetworkError("An error occurred while trying to connect to the Java server")

    def awaitTermination(self, _timeout: float) -> None:
        self.stop_event.set()  # the SIGTERM arrives while we wait

    lastProgress = None  # noqa: N815  pyspark's name


class Writer:
    last_input_at = 0.0
    batches_seen = 0
    in_batch = False
    settled = False
    idle_s = TransactionalBatchWriter.idle_s

    def __init__(self) -> None:
        self.between_batches = threading.Event()
        self.stop_requested = False

    def request_stop(self) -> None:
        self.stop_requested = True


class Batches:
    """A query that stays active for ``polls`` polls of the runner, then ends."""

    def __init__(self, polls: int, progress: dict[str, Any] | None = None) -> None:
        self.polls = polls
        self.lastProgress = progress

    @property
    def isActive(self) -> bool:
        return self.polls > 0

    def awaitTermination(self, _timeout: float) -> None:
        self.polls -= 1

    def exception(self) -> None:
        return None


@pytest.mark.parametrize("in_batch", [True, False])
def test_until_idle_never_stops_during_a_batch(in_batch: bool) -> None:
    """A batch slower than --until-idle (a loaded machine, a cold cluster) is work: stopping
    then would leave the rest of the raw topic unread by a run that was asked to drain it."""
    writer = Writer()
    writer.batches_seen = 1
    writer.in_batch = in_batch  # the last input came long ago (last_input_at 0.0)
    stop = threading.Event()
    stopped: list[bool] = []

    def graceful(_query: Any, _writer: Any) -> None:
        stopped.append(True)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "_graceful_stop", graceful)
        runner.drive(Batches(3), writer, None, stop, until_idle=1.0)
    assert stop.is_set() is (not in_batch)
    assert stopped == ([] if in_batch else [True])


def _progress(end: int, latest: int) -> dict[str, Any]:
    return {
        "id": "q",
        "batchId": 3,
        "sources": [
            {
                "description": "KafkaV2[Subscribe[raw]]",
                "endOffset": {"raw": {"0": end, "1": 7}},
                "latestOffset": {"raw": {"0": latest, "1": 7}},
            }
        ],
    }


@pytest.mark.parametrize(("latest", "stops"), [(5_000, False), (2_000, True)])
def test_until_idle_waits_while_the_last_batch_left_input_unread(latest: int, stops: bool) -> None:
    """Between two bounded batches of a backlog, a loaded driver can plan for longer than
    --until-idle: that is not idleness while the last batch ended short of the log end."""
    writer = Writer()
    writer.batches_seen = 1
    stop = threading.Event()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "_graceful_stop", lambda _q, _w: None)
        query = Batches(3, _progress(2_000, latest))

        class Metrics:
            def observe_progress(self, _progress: object) -> None:
                pass

        runner.drive(query, writer, Metrics(), stop, until_idle=1.0)
    assert stop.is_set() is stops


@pytest.mark.parametrize(
    ("settled", "in_batch", "latest", "stops"),
    [
        (True, False, 2_000, True),
        (False, False, 2_000, False),  # a gap waits for its second scan, or input came
        (True, True, 2_000, False),  # a batch runs: it may find input
        (True, False, 5_000, False),  # the last batch ended short of the log end
    ],
)
def test_until_settled_stops_once_a_batch_found_nothing_to_read_and_no_gap_pending(
    settled: bool, in_batch: bool, latest: int, stops: bool
) -> None:
    """--until-settled: every gap reported and nothing left to read, without waiting for a
    number of idle seconds (the last input came a moment ago: ``last_input_at`` now)."""
    writer = Writer()
    writer.batches_seen = 2
    writer.last_input_at = time.monotonic()
    writer.settled = settled
    writer.in_batch = in_batch
    stop = threading.Event()

    class Metrics:
        def observe_progress(self, _progress: object) -> None:
            pass

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner, "_graceful_stop", lambda _q, _w: None)
        runner.drive(Batches(2, _progress(2_000, latest)), writer, Metrics(), stop,
                     until_idle=3600.0, until_settled=True)  # fmt: skip
    assert stop.is_set() is stops


def test_until_settled_is_a_flag_of_the_dedup_command() -> None:
    parser = cli._parser("kafka-diode dedup")
    assert parser.parse_args(["--until-settled"]).until_settled is True
    assert parser.parse_args([]).until_settled is False


def test_stop_spark_after_a_requested_stop_with_the_jvm_gone_is_logged_at_info(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="dedup.runner"):
        runner.stop_spark(GoneSpark(), requested=True)
    (record,) = [r for r in caplog.records if "already exited" in r.getMessage()]
    assert record.levelno == logging.INFO


def test_a_requested_stop_that_finds_the_jvm_gone_exits_0() -> None:
    stop = threading.Event()
    assert runner.drive(GoneQuery(stop), Writer(), None, stop) == runner.EXIT_OK


def test_the_jvm_gone_without_a_stop_request_is_a_failure() -> None:
    class Crashed(GoneQuery):
        @property
        def isActive(self) -> bool:
            raise ConnectionRefusedError(111, "Connection refused")

    assert runner.drive(Crashed(threading.Event()), Writer(), None, threading.Event()) == 1


def test_other_errors_from_spark_stop_are_not_swallowed() -> None:
    class Broken:
        def stop(self) -> None:
            raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        runner.stop_spark(Broken(), requested=True)


class StoppableQuery:
    """A query whose trigger is always active (no-data batches off, trigger 0: it polls offsets)."""

    def __init__(self) -> None:
        self.status = {"isTriggerActive": True}
        self.stopped_at: float | None = None

    def stop(self) -> None:
        self.stopped_at = time.monotonic()


def test_a_stop_between_writes_does_not_wait_for_a_batch_that_may_never_come() -> None:
    """Without no-data micro-batches an active trigger may be an offset poll that finds nothing:
    only a write under way is waited for (the bounded wait was 300 s per stop before)."""
    query, writer = StoppableQuery(), Writer()
    runner._graceful_stop(query, writer)
    assert writer.stop_requested
    assert query.stopped_at is not None


def test_a_stop_during_a_write_waits_for_it_to_return() -> None:
    query, writer = StoppableQuery(), Writer()
    writer.in_batch = True
    ended: list[float] = []

    def finish_write() -> None:
        ended.append(time.monotonic())
        writer.in_batch = False
        writer.between_batches.set()

    timer = threading.Timer(0.3, finish_write)
    timer.start()
    try:
        runner._graceful_stop(query, writer)
    finally:
        timer.join()
    assert query.stopped_at is not None
    assert ended
    assert query.stopped_at >= ended[0]


def _unreachable_config() -> Any:
    return from_sources(
        env={
            "RAW_TOPICS": "raw",
            "BOOTSTRAP_SERVERS": "127.0.0.1:1",  # nothing listens on port 1
            "STATE_DIR_CONFIG": "/tmp/unused-checkpoint",
            "CLEAN_TOPIC": "clean.{topic}",
            "GAP_TOPIC": "gaps",
        }
    )


def test_waiting_for_kafka_says_so_and_a_stop_ends_the_wait(caplog: Any) -> None:
    stop = threading.Event()
    timer = threading.Timer(2.0, stop.set)  # the operator's SIGTERM, two seconds in
    timer.start()
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dedup.runner"):
        assert runner.wait_for_kafka(_unreachable_config(), stop, probe_timeout=0.3) is False
    assert time.monotonic() - began < 10
    (line,) = [r.getMessage() for r in caplog.records if "does not answer" in r.getMessage()]
    assert "127.0.0.1:1" in line
    assert "before starting Spark" in line


def _moving(name: str = "_TIMED_OUT") -> KafkaClientError:
    """A topic creation ended by a controller failing over (runtime.kafka maps it retriable)."""
    return kafka.error(KafkaError(getattr(KafkaError, name)), "cannot create topic 'x'", topic="x")


def test_starting_the_query_is_tried_again_while_the_cluster_fails_over(caplog: Any) -> None:
    tries: list[int] = []

    def start() -> str:
        tries.append(1)
        if len(tries) < 3:
            raise _moving("_TIMED_OUT" if len(tries) == 1 else "NOT_CONTROLLER")
        return "query"

    with caplog.at_level(logging.WARNING, logger="dedup.runner"):
        started = runner.start_retrying(start, threading.Event(), pause=0.01, say_every=60)
    assert started == "query"
    assert len(tries) == 3
    (line,) = [r.getMessage() for r in caplog.records if "trying again" in r.getMessage()]
    assert "cannot create topic 'x'" in line  # said once a minute, with the cause


def test_a_refusal_while_starting_the_query_is_raised_not_retried() -> None:
    tries: list[int] = []

    def start() -> str:
        tries.append(1)
        raise kafka.error(KafkaError(KafkaError.POLICY_VIOLATION), "cannot create topic 'x'")

    with pytest.raises(KafkaClientError, match="cannot create topic"):
        runner.start_retrying(start, threading.Event(), pause=0.01)
    assert len(tries) == 1


def test_a_stop_ends_the_retries_of_starting_the_query() -> None:
    stop = threading.Event()

    def start() -> str:
        stop.set()  # the operator's SIGTERM while the cluster still fails over
        raise _moving()

    assert runner.start_retrying(start, stop, pause=30) is None
