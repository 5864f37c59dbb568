"""The one place that builds Kafka clients and turns librdkafka's errors into ours.

Every component asks here for a :func:`producer`, :func:`consumer` or :func:`admin`: a property
the client refuses becomes a :class:`~common.errors.ConfigError` naming it, at start-up, instead
of a bare ``KafkaException`` wherever the client happened to be built. :func:`error` maps a
``KafkaException``/``KafkaError`` met later to :class:`~common.errors.KafkaClientError` with
librdkafka's error name and whether trying again may succeed. :func:`create_missing_topics`
creates the topics a component needs and waits for their leaders (the one place that does, for
every component).
:func:`read_to_end` reads a (compacted) topic from its beginning to its current end, the way
``gaps`` and ``bundle`` read the gap topic.

Importable inside Spark executors (the dedup's writer runs there): no asyncio, no event loop.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    NewTopic,
    ResourceType,
)

from common.errors import ConfigError, KafkaClientError, ServiceError

log = logging.getLogger(__name__)

#: The configuration key a refused client property is reported under (operators set client
#: properties through each command's ``kafka`` table or ``*KAFKA_CONF_*`` variables).
CLIENT_CONF_KEY = "kafka"
#: ``fetch.queue.backoff.ms`` of the consumers that bound their prefetch queue (the sender's,
#: the dedup's raw readers): a partition whose queue is full fetches again this long after.
#: librdkafka's default, 1 s, outlasts such a queue drained at full speed, and the reader
#: waited out the rest (docs/benchmarks.md, "Sender"). Where the reader is slower than the
#: broker (a paced sender) the queue stays full and this is one timer check per partition.
FETCH_QUEUE_BACKOFF_MS = 10
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


#: Errors that say the cluster is moving, not that it refuses: retriable whatever librdkafka's
#: flag says. An admin request's result carries no retriable flag, and during a controller's or
#: a leader's failover CreateTopics ends in ``_TIMED_OUT`` ("Timed out waiting for controller":
#: the client waits on a controller its metadata still names), which a new client, asking the
#: cluster again, gets past. ``_DESTROY_BROKER``: a request was pending at a broker the cluster's
#: metadata no longer lists (killed, then fenced by the controller); its partitions have new
#: leaders.
TRANSIENT_ERRORS = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError._DESTROY_BROKER,
        KafkaError._TRANSPORT,
        KafkaError._ALL_BROKERS_DOWN,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_CONTROLLER,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.BROKER_NOT_AVAILABLE,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.THROTTLING_QUOTA_EXCEEDED,
    }
)


def error(
    exc: KafkaException | KafkaError, doing: str, *, topic: str | None = None
) -> KafkaClientError:
    """``exc`` (raised or reported while ``doing``) as our exception, to ``raise ... from exc``;
    ``topic``: the topic the call was about, if one. Retriable: librdkafka says so, or the error
    is one of ``TRANSIENT_ERRORS``."""
    err = exc.args[0] if isinstance(exc, KafkaException) and exc.args else exc
    if isinstance(err, KafkaError):
        return KafkaClientError(
            f"{doing}: {err.str()}",
            name=err.name(),
            retriable=bool(err.retriable()) or err.code() in TRANSIENT_ERRORS,
            topic=topic,
        )
    return KafkaClientError(f"{doing}: {exc}", name="", retriable=False, topic=topic)


@dataclass(frozen=True, kw_only=True, slots=True)
class TopicSpec:
    """A topic to create when it is missing (an existing topic is left as it is)."""

    name: str
    """The topic's name."""
    partitions: int = -1
    """Partitions to create it with; -1: the broker's ``num.partitions``."""
    replication: int = -1
    """Replication factor to create it with; -1: the broker's ``default.replication.factor``."""
    config: Mapping[str, str] = field(default_factory=dict)
    """Topic settings to create it with (``max.message.bytes``, ``cleanup.policy``, ...)."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ConfigError("topic", "a topic name must not be empty", "name the topic")
        for key, value in (("partitions", self.partitions), ("replication", self.replication)):
            if value != -1 and value < 1:
                raise ConfigError(
                    f"{self.name}.{key}",
                    f"must be at least 1 (or -1 for the broker's default), not {value}",
                )


@dataclass(frozen=True, kw_only=True, slots=True)
class EnsuredTopics:
    """What :func:`create_missing_topics` found and did."""

    created: tuple[str, ...]
    """Topics this call created (in the order given)."""
    partitions: Mapping[str, int]
    """Partition count of every topic asked for, created or found."""


def create_missing_topics(
    conf: Mapping[str, Any],
    specs: Iterable[TopicSpec],
    *,
    timeout: float,
    reach_timeout: float | None = None,
) -> EnsuredTopics:
    """Create those of ``specs`` that do not exist, and return once every partition of the
    topics it created has a leader (created is not yet usable: metadata and leaders reach the
    brokers a moment later, and a produce or describe in between fails).

    A topic that someone else creates meanwhile (``TOPIC_ALREADY_EXISTS``) counts as found. A
    topic refused for too few brokers (``INVALID_REPLICATION_FACTOR``: one may be restarting) is
    asked for again, once a second, until ``timeout``. Existing topics are not changed, nor
    checked: their partitions are reported for the caller to judge.

    Args:
        conf: client properties (``bootstrap.servers``, security).
        specs: the topics; a name given twice is asked for once (the first spec wins).
        timeout: seconds for the creation (with its tries) and for the leaders to appear.
        reach_timeout: seconds for the first metadata answer (default: ``timeout``).

    Raises:
        ConfigError: the client refused ``conf``.
        KafkaClientError: the cluster did not answer in time (``topic`` None), refused to create
            a topic (``topic`` set; ``name`` says why: ``INVALID_REPLICATION_FACTOR``,
            ``POLICY_VIOLATION``, ``TOPIC_AUTHORIZATION_FAILED``, ...), or a created topic had
            no leader within ``timeout`` (``name`` ``_TIMED_OUT``).
    """
    wanted: dict[str, TopicSpec] = {}
    for spec in specs:
        wanted.setdefault(spec.name, spec)
    client = admin(conf)
    reach = timeout if reach_timeout is None else min(reach_timeout, timeout)
    where = conf.get("bootstrap.servers", "?")
    try:
        metadata = client.list_topics(timeout=reach).topics
    except KafkaException as exc:
        raise error(exc, f"cannot reach Kafka at {where} within {reach:.0f} s") from exc
    found = {
        name: len(meta.partitions)
        for name in wanted
        if (meta := metadata.get(name)) is not None and meta.error is None
    }
    missing = [spec for name, spec in wanted.items() if name not in found]
    created: list[str] = []
    if missing:
        deadline = time.monotonic() + timeout
        waiting, refused = missing, set[str]()
        while waiting:
            waiting = _create(
                client,
                waiting,
                timeout=timeout,
                deadline=deadline,
                created=created,
                refused=refused,
            )
        found.update(_wait_for_leaders(client, missing, timeout))
    return EnsuredTopics(created=tuple(created), partitions=found)


#: Seconds between the tries of a topic that a restarting broker keeps from being created.
CREATE_RETRY_S = 1.0


def _create(
    client: AdminClient,
    specs: Sequence[TopicSpec],
    *,
    timeout: float,
    deadline: float,
    created: list[str],
    refused: set[str],
) -> list[TopicSpec]:
    """Ask for ``specs`` once; appends those created to ``created`` and returns those to ask for
    again: refused for too few brokers (``INVALID_REPLICATION_FACTOR``) while ``deadline`` is
    ahead (``refused`` names those refused before). A broker of a rolling restart is
    unregistered for seconds, and a component started then would stop at start-up; a cluster
    that is too small stays refused until the deadline."""
    # a try after a refusal gets what is left of the deadline, not ``timeout`` again: a broker
    # that stops answering mid-try must not stretch the creation by a whole timeout per try
    left = min(timeout, max(1.0, deadline - time.monotonic()))
    futures = client.create_topics(
        [NewTopic(s.name, s.partitions, s.replication, config=dict(s.config)) for s in specs],
        operation_timeout=left,
        request_timeout=left,
    )
    again: list[TopicSpec] = []
    for spec in specs:
        try:
            futures[spec.name].result(left + 5)
            created.append(spec.name)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code == KafkaError.TOPIC_ALREADY_EXISTS:
                continue  # created meanwhile by someone else
            if code == KafkaError.INVALID_REPLICATION_FACTOR and time.monotonic() < deadline:
                # once per topic: the tries a second after it say nothing new
                log.log(
                    logging.DEBUG if spec.name in refused else logging.WARNING,
                    "cannot create topic %r yet: %s; a broker may be restarting, trying again "
                    "for %.0f s more",
                    spec.name,
                    err.str() if isinstance(err, KafkaError) else exc,
                    deadline - time.monotonic(),
                )
                refused.add(spec.name)
                again.append(spec)
                continue
            raise error(exc, f"cannot create topic {spec.name!r}", topic=spec.name) from exc
    if again:
        time.sleep(
            min(CREATE_RETRY_S, max(0.0, deadline - time.monotonic()))
        )  # a pause between tries
    return again


def _wait_for_leaders(
    client: AdminClient, specs: Sequence[TopicSpec], timeout: float
) -> dict[str, int]:
    """Poll metadata until every partition of ``specs`` has a leader; their partition counts."""
    deadline = time.monotonic() + timeout
    waiting = {spec.name: spec for spec in specs}
    counts: dict[str, int] = {}
    while True:
        try:
            metadata = client.list_topics(timeout=max(1.0, deadline - time.monotonic())).topics
        except KafkaException:
            metadata = {}  # asked again until the deadline
        for name, spec in list(waiting.items()):
            meta = metadata.get(name)
            if (
                meta is not None
                and meta.error is None
                and meta.partitions
                and len(meta.partitions) >= spec.partitions
                and all(p.leader >= 0 and p.error is None for p in meta.partitions.values())
            ):
                counts[name] = len(meta.partitions)
                del waiting[name]
        if not waiting:
            return counts
        if time.monotonic() >= deadline:
            names = ", ".join(waiting)
            raise KafkaClientError(
                f"topics {names} were created but have no leader after {timeout:.0f} s:"
                " check the brokers' logs",
                name="_TIMED_OUT",
                retriable=True,
                topic=next(iter(waiting)),
            )
        time.sleep(0.1)  # poll interval of a condition wait with a deadline


def broker_count(conf: Mapping[str, Any], timeout: float) -> int:
    """How many brokers the cluster has, as :func:`cluster_metadata` counts them.

    Raises:
        KafkaClientError: the cluster did not answer within ``timeout`` seconds.
    """
    return cluster_metadata(conf, timeout)[0]


def cluster_metadata(conf: Mapping[str, Any], timeout: float) -> tuple[int, list[str]]:
    """How many brokers the cluster has (:func:`known_brokers`), and its topics' names
    (internal ones included), from one metadata request.

    Raises:
        KafkaClientError: the cluster did not answer within ``timeout`` seconds.
    """
    meta = _metadata(conf, timeout)
    return known_brokers(meta), list(meta.topics)


def known_brokers(meta: Any) -> int:
    """The brokers a metadata answer (``ClusterMetadata``) shows: those up, and those any
    partition names as a replica.

    The metadata lists only the brokers that are up, so a node that is down (a rolling restart,
    a crash) is missing from it; it is still named among the replicas of the partitions it holds
    (the internal topics of a three-node cluster are on all three). Counting both, a component
    started while one node of three is down does not conclude that the cluster has two.
    """
    ids = set(meta.brokers)
    for topic in meta.topics.values():
        for partition in topic.partitions.values():
            ids.update(partition.replicas)
    return len(ids)


def _metadata(conf: Mapping[str, Any], timeout: float) -> Any:
    """The cluster's metadata, every topic (a request naming one that is missing would make a
    broker with ``auto.create.topics.enable`` create it).

    Raises:
        KafkaClientError: the cluster did not answer within ``timeout`` seconds.
    """
    try:
        return admin(conf).list_topics(timeout=timeout)
    except KafkaException as exc:
        raise error(exc, f"cannot reach Kafka at {conf.get('bootstrap.servers', '?')}") from exc


def topic_partitions(conf: Mapping[str, Any], topic: str, timeout: float) -> int:
    """How many partitions ``topic`` has; 0 if it does not exist.

    Raises:
        KafkaClientError: the cluster did not answer within ``timeout`` seconds.
    """
    found = _metadata(conf, timeout).topics.get(topic)
    if found is None or found.error is not None:
        return 0
    return len(found.partitions)


def topic_config(conf: Mapping[str, Any], topic: str, timeout: float) -> dict[str, str]:
    """``{setting: value}`` of ``topic`` as the broker applies it (defaults included).

    Raises:
        KafkaClientError: the broker did not answer, or the topic cannot be described.
    """
    return topic_configs(conf, [topic], timeout)[topic]


def topic_configs(
    conf: Mapping[str, Any], topics: Iterable[str], timeout: float
) -> dict[str, dict[str, str]]:
    """:func:`topic_config` of several topics, in one request per broker.

    Raises:
        KafkaClientError: the broker did not answer, or a topic cannot be described.
    """
    client = admin(conf)
    resources = [ConfigResource(ResourceType.TOPIC, topic) for topic in topics]
    if not resources:
        return {}
    futures = client.describe_configs(resources, request_timeout=timeout)
    out: dict[str, dict[str, str]] = {}
    for resource, future in futures.items():
        try:
            entries = future.result(timeout)
        except KafkaException as exc:
            raise error(exc, f"reading the configuration of topic {resource.name}") from exc
        out[resource.name] = {
            name: entry.value for name, entry in entries.items() if entry.value is not None
        }
    return out


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
