"""Root fixtures. Importable without Kafka: brokers start lazily, only when a test asks for one.

``upstream_kafka`` / ``downstream_kafka``: session-scoped real brokers (``LocalBroker``, with
``.bootstrap``) on free ports with temporary data dirs; both may run at once. ``kafka_topic``: a
factory ``make_topic(broker, partitions=3, config=None) -> str`` for random, ready topics.
``group_id``: a random consumer group id. Helpers live in ``tests/kafka_helpers.py``.
"""

from __future__ import annotations

import gc
import logging
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest
from hypothesis import HealthCheck, settings

if TYPE_CHECKING:
    from kafka_diode.local_kafka.broker import LocalBroker


# Property tests check outcomes, never speed (that is bench/'s job): a per-example deadline only
# measures how busy the machine is (a 2-core CI host running brokers beside them), so none.
settings.register_profile(
    "kafka-diode", deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("kafka-diode")


@pytest.fixture(autouse=True)
def _root_logging_restored() -> Iterator[None]:
    """Commands run in-process (``resend_cli.main`` ...) point the root logger at the
    ``sys.stderr`` of that moment, which pytest's ``capsys`` closes after the test (it is torn
    down before this autouse fixture): drop handlers left writing to a closed stream, so no
    later test logs into one."""
    root = logging.getLogger()
    level = root.level
    yield
    for handler in root.handlers[:]:
        stream = getattr(handler, "stream", None)
        if stream is not None and getattr(stream, "closed", False):
            root.removeHandler(handler)
    root.setLevel(level)


def _session_broker(role: str, factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    from tests import kafka_helpers  # noqa: PLC0415  (lazy: collection must not need Kafka)

    broker = kafka_helpers.start_test_broker(role, factory.mktemp(f"kafka-{role}"))
    try:
        yield broker
    finally:
        # Clients that tests dropped inside reference cycles are destroyed here, while the
        # broker still answers, not at exit retrying a stopped one ("Connection refused").
        gc.collect()
        broker.stop()


@pytest.fixture(scope="session")
def upstream_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """The high-side cluster: a real single-node broker for the whole test session."""
    yield from _session_broker("up", tmp_path_factory)


@pytest.fixture(scope="session")
def downstream_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """The low-side cluster: a second, independent broker."""
    yield from _session_broker("down", tmp_path_factory)


@pytest.fixture
def kafka_topic() -> Callable[..., str]:
    """Factory: ``kafka_topic(broker_or_bootstrap, partitions=3, config=None) -> topic name``."""
    from tests import kafka_helpers  # noqa: PLC0415

    def make_topic(broker: Any, partitions: int = 3, config: dict[str, str] | None = None) -> str:
        return kafka_helpers.create_topic(broker, partitions=partitions, config=config)

    return make_topic


@pytest.fixture
def group_id() -> str:
    """A consumer group id no other test uses."""
    return f"g-{uuid.uuid4().hex[:12]}"


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Stop brokers even when the session ends abnormally (Ctrl+C skips fixture teardown)."""
    import sys  # noqa: PLC0415

    helpers = sys.modules.get("tests.kafka_helpers")
    if helpers is not None:
        helpers.stop_test_brokers()
