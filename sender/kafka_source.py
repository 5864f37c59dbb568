"""Upstream Kafka source: one confluent-kafka consumer on its own thread, driven from the loop.

Every call into the consumer (consume, pause, resume, commit, close, topic listing) runs on one
dedicated executor thread, so librdkafka's callbacks (assignment, errors) also run there and
nothing blocks the event loop. ``consume`` hands a whole batch (``Consumer.consume(n, timeout)``)
back to the loop as the result of an executor future: no per-record Python object is built
here; the application reads each message's fields straight into the wire encoder.

Guarantees:

- Auto-commit is off. Offsets are committed only by ``commit``, which the application calls with
  offsets whose datagrams were handed to the socket (docs/sender.md, "Delivery order"). On a
  revocation, the revoked partitions' sent offsets are committed before they go.
- The start position (earliest, latest, timestamp) applies to the first assignment of each
  partition in this process; ``committed`` starts from the group's commit (earliest when none).
- A broker that is down never raises out of here: errors are counted by kind (``errors``) and
  logged at a rate-limited level, and librdkafka keeps reconnecting with backoff.
- ``pause_all`` pauses every assigned partition, including ones assigned while paused.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

from common.errors import ServiceError
from common.logging import RateLimitedLog
from runtime import kafka
from sender.config import SenderConfig

log = logging.getLogger(__name__)

#: Topics no sender ever reads (Kafka's own: __consumer_offsets, __transaction_state, ...).
INTERNAL_TOPIC = re.compile(r"^__")


class KafkaSource:
    """The sender's consumer; every method is safe to call from the event loop."""

    def __init__(
        self,
        config: SenderConfig,
        *,
        loop: asyncio.AbstractEventLoop,
        committable: Callable[[], Mapping[tuple[str, int], int]] = dict,
    ) -> None:
        """``committable()`` returns the highest sent offset per partition (read on revocation)."""
        self._config = config
        self._loop = loop
        self._committable = committable
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="kafka-source")
        self._consumer: Consumer | None = None
        self._lock = threading.Lock()  # guards the sets below (loop thread reads them)
        self._assigned: set[tuple[str, int]] = set()
        self._started_partitions: set[tuple[str, int]] = set()
        self._paused = False
        self._committed: dict[tuple[str, int], int] = {}
        self._subscribed: tuple[str, ...] = ()
        self.errors: dict[str, int] = {}
        """Errors by kind (``broker``, ``commit``, ``consume``...), for metrics."""
        self._ratelog = RateLimitedLog(log)
        self._includes = [re.compile(t) for t in config.topics if t.startswith("^")]
        self._names = {t for t in config.topics if not t.startswith("^")}
        self._exclude = re.compile(config.exclude_topics) if config.exclude_topics else None

    # -- lifecycle ------------------------------------------------------------------------------

    async def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await self._loop.run_in_executor(self._executor, fn, *args)

    async def start(self) -> None:
        """Create the consumer (never waits for the broker: that happens in ``refresh_topics``).

        Raises:
            ConfigError: librdkafka refused a property (names ``kafka``).
        """
        props: dict[str, Any] = dict(self._config.group_consumer_properties())
        props["error_cb"] = self._on_error
        props["on_commit"] = self._on_commit_cb
        self._consumer = await self._call(kafka.consumer, props)

    @property
    def needs_metadata(self) -> bool:
        """True when the topic list comes from broker metadata (regex or exclude pattern)."""
        return bool(self._includes) or self._exclude is not None

    async def refresh_topics(self) -> bool:
        """Resolve the topic selection and (re)subscribe when it changed.

        Returns:
            True when the subscription is in place, False when the broker could not be asked
            (counted as a ``broker`` error; call again later).
        """
        return bool(await self._call(self._refresh_topics))

    def _select(self, names: list[str]) -> tuple[str, ...]:
        chosen = set()
        for name in names:
            if INTERNAL_TOPIC.match(name):
                continue
            if self._exclude is not None and self._exclude.search(name):
                continue
            if name in self._names or any(p.search(name) for p in self._includes):
                chosen.add(name)
        return tuple(sorted(chosen))

    def _refresh_topics(self) -> bool:
        consumer = self._require()
        if self.needs_metadata:
            try:
                meta = consumer.list_topics(timeout=5.0)
            except KafkaException as exc:
                self._count("broker")
                self._ratelog.warning("meta", "cannot list topics (broker down?): %s", exc)
                return False
            topics = self._select(list(meta.topics))
        else:
            topics = self._select(sorted(self._names))
        if topics != self._subscribed:
            if topics:
                consumer.subscribe(
                    list(topics),
                    on_assign=self._on_assign,
                    on_revoke=self._on_revoke,
                    on_lost=self._on_lost,
                )
            else:
                consumer.unsubscribe()
            log.info("reading topics: %s", ", ".join(topics) or "(none yet)")
            self._subscribed = topics
        return True

    async def consume(self) -> list[Message]:
        """One batch of up to ``batch_size`` messages (possibly empty; may hold error messages)."""
        return list(
            await self._call(
                self._require().consume, self._config.batch_size, self._config.poll_timeout
            )
        )

    async def pause_all(self) -> None:
        """Stop fetching every assigned partition (backpressure)."""
        await self._call(self._set_paused, True)

    async def resume_all(self) -> None:
        """Resume fetching."""
        await self._call(self._set_paused, False)

    def _set_paused(self, paused: bool) -> None:
        consumer = self._require()
        self._paused = paused
        tps = consumer.assignment()
        if not tps:
            return
        try:
            if paused:
                consumer.pause(tps)
            else:
                consumer.resume(tps)
        except KafkaException as exc:
            self._count("pause")
            self._ratelog.warning("pause", "pause/resume failed: %s", exc)

    async def commit(self, offsets: Mapping[tuple[str, int], int]) -> bool:
        """Commit ``offsets`` (the *next* offset to read, per partition) synchronously.

        Returns False (counted as a ``commit`` error) when the broker refused or is away; the
        caller simply commits again later, since commits only move forward.
        """
        if not offsets:
            return True
        return bool(await self._call(self._commit, dict(offsets)))

    def _commit(
        self, offsets: dict[tuple[str, int], int], consumer: Consumer | None = None
    ) -> bool:
        consumer = consumer or self._require()
        with self._lock:
            owned = {tp: o for tp, o in offsets.items() if tp in self._assigned}
        todo = {tp: o for tp, o in owned.items() if self._committed.get(tp) != o}
        if not todo:
            return True
        try:
            consumer.commit(
                offsets=[TopicPartition(t, p, o) for (t, p), o in todo.items()],
                asynchronous=False,
            )
        except KafkaException as exc:
            self._count("commit")
            self._ratelog.warning("commit", "offset commit failed (will retry): %s", exc)
            return False
        self._committed.update(todo)
        return True

    async def lag(self, *, fresh: bool = False) -> dict[tuple[str, int], int]:
        """Per assigned partition: high watermark minus the next offset to read.

        Before the first record of a partition was read, the next offset is the group's commit,
        or (starting from the beginning) the low watermark, so a consumer that never reads shows
        its lag too. ``fresh`` asks the broker for the watermarks instead of using the values the
        last fetch brought (which a stalled consumer never updates): a blocking round trip, for
        the stall check only.
        """
        return dict(await self._call(self._lag, fresh))

    def _lag(self, fresh: bool = False) -> dict[tuple[str, int], int]:
        consumer = self._require()
        out: dict[tuple[str, int], int] = {}
        from_start = self._config.start_position in ("earliest", "committed")
        try:
            positions = consumer.position(consumer.assignment())
            unread = [tp for tp in positions if tp.offset < 0]
            commits = {
                (tp.topic, tp.partition): tp.offset
                for tp in (consumer.committed(unread, timeout=5.0) if fresh and unread else ())
            }
            for tp in positions:
                if fresh:
                    low, high = consumer.get_watermark_offsets(tp, timeout=5.0, cached=False)
                else:
                    low, high = consumer.get_watermark_offsets(tp, cached=True)
                nxt = tp.offset
                if nxt < 0:
                    nxt = commits.get((tp.topic, tp.partition), -1)
                if nxt < 0 and from_start:
                    nxt = low
                if high >= 0 and nxt >= 0:
                    out[(tp.topic, tp.partition)] = max(0, high - nxt)
        except KafkaException:
            self._count("broker")
        return out

    async def reopen(self) -> None:
        """Replace the consumer with a new one (stall recovery): the old one's revocation commits
        the sent offsets as it closes, the new one subscribes again (a static member takes the
        old one's place) and starts from the group's commits. Call only between ``consume``
        calls."""
        await self._call(self._reopen)

    def _reopen(self) -> None:
        old = self._require()
        try:
            old.close()
        except (KafkaException, RuntimeError) as exc:
            log.warning("consumer close before re-creating it: %s", exc)
        props: dict[str, Any] = dict(self._config.group_consumer_properties())
        props["error_cb"] = self._on_error
        props["on_commit"] = self._on_commit_cb
        self._consumer = kafka.consumer(props)
        with self._lock:
            self._assigned.clear()
        self._subscribed = ()
        self._refresh_topics()

    def assignment(self) -> set[tuple[str, int]]:
        """Partitions currently assigned to this sender."""
        with self._lock:
            return set(self._assigned)

    async def close(self) -> None:
        """Leave the group and stop the thread (idempotent; commits nothing by itself)."""
        if self._consumer is not None:
            consumer = self._consumer
            try:
                # Revocation callbacks run inside close() and still need the consumer.
                await self._call(consumer.close)
            except (KafkaException, RuntimeError) as exc:
                log.warning("consumer close: %s", exc)
            self._consumer = None
        self._executor.shutdown(wait=True)

    # -- callbacks (consumer thread) ------------------------------------------------------------

    def _require(self) -> Consumer:
        if self._consumer is None:
            raise ServiceError("the Kafka source is not started or already closed")
        return self._consumer

    def _count(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def _on_error(self, err: KafkaError) -> None:
        self._count("broker")
        self._ratelog.warning(f"err:{err.code()}", "Kafka: %s", err.str())

    def _on_commit_cb(self, err: KafkaError | None, _partitions: list[TopicPartition]) -> None:
        if err is not None:
            self._count("commit")

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        position = self._config.start_position
        fresh = [
            tp for tp in partitions if (tp.topic, tp.partition) not in self._started_partitions
        ]
        if fresh and position != "committed":
            if position == "earliest":
                for tp in fresh:
                    tp.offset = OFFSET_BEGINNING
            elif position == "latest":
                for tp in fresh:
                    tp.offset = OFFSET_END
            else:
                stamp = self._config.start_timestamp_ms()
                query = [TopicPartition(tp.topic, tp.partition, stamp) for tp in fresh]
                try:
                    found = {
                        (r.topic, r.partition): r.offset
                        for r in consumer.offsets_for_times(query, timeout=10.0)
                    }
                except KafkaException as exc:
                    self._count("broker")
                    log.error(  # noqa: TRY400  the broker error text is the useful part
                        "offsets_for_times failed, starting at committed offsets: %s", exc
                    )
                    found = {}
                for tp in fresh:
                    # -1: no record at or after the time: start at the end.
                    offset = found.get((tp.topic, tp.partition))
                    if offset is not None:
                        tp.offset = offset if offset >= 0 else OFFSET_END
        consumer.assign(partitions)
        with self._lock:
            self._assigned.update((tp.topic, tp.partition) for tp in partitions)
            self._started_partitions.update((tp.topic, tp.partition) for tp in partitions)
        if self._paused:
            consumer.pause(partitions)
        log.info("assigned %d partitions", len(partitions))

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        sent = dict(self._committable())
        revoked = {(tp.topic, tp.partition) for tp in partitions}
        offsets = {tp: o + 1 for tp, o in sent.items() if tp in revoked}
        if offsets:
            self._commit(offsets, consumer)
        with self._lock:
            self._assigned -= revoked
        consumer.unassign()
        log.info("revoked %d partitions", len(partitions))

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        with self._lock:
            self._assigned -= {(tp.topic, tp.partition) for tp in partitions}
        consumer.unassign()
        log.warning(
            "lost %d partitions (session timeout); another member will re-read them",
            len(partitions),
        )
