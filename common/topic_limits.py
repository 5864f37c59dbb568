"""What the downstream topics must admit, and how to tell from their configuration (pure).

Two promises depend on the downstream broker's topic settings, not on our code:

- **Size.** A record of up to ``max_record_size`` bytes (key + value + headers, as the sender
  measures it) becomes a raw record with a ``<topic>:<partition>:<offset>`` key and four
  provenance headers, and later a clean record. :func:`record_limit` is the size every producer
  (``message.max.bytes``) and topic (``max.message.bytes``) on the way must admit: the record plus
  :data:`RECORD_OVERHEAD` for the raw key, the provenance headers and Kafka's record and batch
  framing.
- **Timestamps.** The clean topic keeps the source timestamp (CreateTime). A broker refuses a
  CreateTime more than ``message.timestamp.after.max.ms`` ahead of its clock or more than
  ``message.timestamp.before.max.ms`` behind it (Kafka 4: one hour ahead, any age behind), and
  one refused record fails every record of its producer batch. Topics kafka-diode creates get
  both wide open (:data:`ANY_TIMESTAMP`); :class:`TimestampWindow` tells what an existing topic
  accepts so the dedup never hands the broker a timestamp it would refuse (docs/topics.md).

The Kafka calls (AdminClient ``describe_configs``) live in the components; this module only reads
the resulting ``{name: value}`` maps, so the rules are unit-tested without a broker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

#: Bytes on top of ``max_record_size``: raw key (a 249-character topic and two 64-bit numbers),
#: the four provenance headers (the source key moves into one; 20-digit timestamp, 32-character
#: session), Kafka's record framing (varints per record and header) and one record batch header
#: (61 bytes). Generous, so an operator's limit computed from it is never the one that bites.
RECORD_OVERHEAD = 4096
#: Kafka's ``Long.MAX_VALUE``: "no limit" for the timestamp settings.
LONG_MAX = (1 << 63) - 1
#: Topic settings that let a topic take any CreateTime.
ANY_TIMESTAMP = {
    "message.timestamp.after.max.ms": str(LONG_MAX),
    "message.timestamp.before.max.ms": str(LONG_MAX),
}
#: How far inside a topic's timestamp window the dedup stays: its clock and the broker's differ a
#: little (hosts of one network share a time source; more than a minute apart is an incident).
CLOCK_MARGIN_MS = 60_000


def record_limit(max_record_size: int) -> int:
    """The Kafka message size (bytes) a record of ``max_record_size`` needs on the way."""
    return max_record_size + RECORD_OVERHEAD


def created_topic_config(max_record_size: int, *, any_timestamp: bool) -> dict[str, str]:
    """Settings for a topic kafka-diode creates: admits the largest record (and, for clean
    topics, any source timestamp)."""
    config = {"max.message.bytes": str(record_limit(max_record_size))}
    if any_timestamp:
        config.update(ANY_TIMESTAMP)
    return config


def size_problem(
    topic: str,
    configs: Mapping[str, str],
    max_record_size: int,
    setting: str,
    *,
    both_sides: bool = True,
) -> str | None:
    """Why ``topic`` (its ``configs`` from describe_configs) cannot take the largest record, or
    None. ``setting`` names where ``max_record_size`` is configured, for the message;
    ``both_sides``: the setting is one the sender shares (not a receiver-only one such as
    ``run_max_bytes``)."""
    value = configs.get("max.message.bytes")
    if value is None or not value.lstrip("-").isdigit():
        return None  # not readable: nothing to say (the broker still enforces it)
    admits, needed = int(value), record_limit(max_record_size)
    if admits >= needed:
        return None
    return (
        f"topic {topic!r} admits messages up to {admits} bytes (max.message.bytes) but records "
        f"of up to {max_record_size} bytes ({setting}) need {needed}: raise it with "
        f"'kafka-configs --bootstrap-server HOST:PORT --alter --entity-type topics "
        f"--entity-name {topic} --add-config max.message.bytes={needed}', or lower "
        f"{setting}{' on both sides' if both_sides else ''} to at most {admits - RECORD_OVERHEAD}"
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class TimestampWindow:
    """The CreateTimes a topic accepts, relative to the broker's clock."""

    before_ms: int = LONG_MAX
    """How far behind the broker's clock a timestamp may be (``...timestamp.before.max.ms``)."""
    after_ms: int = LONG_MAX
    """How far ahead of it a timestamp may be (``message.timestamp.after.max.ms``)."""
    log_append_time: bool = False
    """``message.timestamp.type=LogAppendTime``: the broker replaces every timestamp (and so
    refuses none)."""

    @property
    def unlimited(self) -> bool:
        """True when any timestamp is kept as it is."""
        return not self.log_append_time and self.before_ms >= LONG_MAX and self.after_ms >= LONG_MAX

    def bounds(self, now_ms: int) -> tuple[int, int]:
        """``(lowest, highest)`` timestamp safe to produce at ``now_ms`` (inclusive; a margin of
        :data:`CLOCK_MARGIN_MS` inside the window), as plain comparisons for a hot loop."""
        if self.log_append_time:
            return -LONG_MAX - 1, LONG_MAX
        low = -LONG_MAX - 1 if self.before_ms >= LONG_MAX else now_ms - self.before_ms
        high = LONG_MAX if self.after_ms >= LONG_MAX else now_ms + self.after_ms
        if low > -LONG_MAX - 1:
            low += CLOCK_MARGIN_MS
        if high < LONG_MAX:
            high -= CLOCK_MARGIN_MS
        return low, high

    def describe(self) -> str:
        """For log lines: the settings that narrow the window."""
        if self.log_append_time:
            return "message.timestamp.type=LogAppendTime"
        parts = []
        if self.after_ms < LONG_MAX:
            parts.append(f"message.timestamp.after.max.ms={self.after_ms}")
        if self.before_ms < LONG_MAX:
            parts.append(f"message.timestamp.before.max.ms={self.before_ms}")
        return ", ".join(parts) or "any timestamp"


def timestamp_window(configs: Mapping[str, str]) -> TimestampWindow:
    """The window of a topic from its describe_configs values (missing ones: no limit; Kafka
    before 3.6 had only ``message.timestamp.difference.max.ms``, which bounds both sides)."""

    def number(name: str) -> int | None:
        value = configs.get(name)
        if value is None or not value.lstrip("-").isdigit():
            return None
        return max(0, int(value))

    legacy = number("message.timestamp.difference.max.ms")
    before = number("message.timestamp.before.max.ms")
    after = number("message.timestamp.after.max.ms")
    if legacy is not None:
        before = legacy if before is None else min(before, legacy)
        after = legacy if after is None else min(after, legacy)
    return TimestampWindow(
        before_ms=LONG_MAX if before is None else before,
        after_ms=LONG_MAX if after is None else after,
        log_append_time=configs.get("message.timestamp.type") == "LogAppendTime",
    )
