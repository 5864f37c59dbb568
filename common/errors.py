"""The one exception tree of kafka-diode.

::

    DiodeError
    ├── ConfigError            bad configuration; names the key and the fix; stops start-up
    ├── LocalProtocolError     we used the protocol API wrongly (a bug on our side)
    │   └── SequenceExhaustedError   (common.wire.encoder) a session used all 2**64 sequences
    ├── RecordTooLarge         (here; re-exported by common.wire.encoder) a record over
    │                          max_record_size: data, not a bug; the caller skips and counts it
    ├── RemoteProtocolError    bytes from the wire are invalid; carries a DropReason
    ├── KeyRingError           key material missing, malformed or unknown
    ├── BundleError            a resend bundle is tampered, truncated, of a wrong version or key
    ├── GapRecordError         (common.gap_record) a gap-topic value that is not a gap record
    ├── GapStateError          (here; raised by the dedup's detector) a saved gap-detector state
    │   │                      that cannot be restored
    │   └── WindowSizeMismatchError  (dedup.detector) the state was saved with another WINDOW_SIZE
    └── ServiceError           an external service (Kafka, Java, Maven, Spark) is unusable
        ├── KafkaClientError   (here; raised by runtime.kafka) a Kafka client call failed
        ├── LocalKafkaError    the embedded broker cannot be fetched, started or stopped
        ├── JvmBuildError      (raised by runtime.jvm_build) our JVM class cannot be compiled
        └── NetemUnavailableError  (netem.tc) tc netem is missing or not permitted here

A test (tests/unit/test_errors.py) keeps this tree complete.

``retriable`` says whether trying the same thing again later may succeed (aiokafka's convention).
Third-party exceptions are wrapped once, at the module that calls the library, with
``raise OurError(...) from exc``.
"""

from __future__ import annotations


class DiodeError(Exception):
    """Root of every exception kafka-diode raises on purpose."""

    retriable: bool = False


class ConfigError(DiodeError):
    """A configuration value is missing or invalid.

    The message always names the key (as the user wrote it: TOML key, environment variable or
    flag) and says how to fix it.
    """

    def __init__(self, key: str, problem: str, fix: str | None = None) -> None:
        self.key = key
        self.problem = problem
        self.fix = fix
        message = f"{key}: {problem}"
        if fix:
            message += f" ({fix})"
        super().__init__(message)


class LocalProtocolError(DiodeError):
    """The protocol API was called in a way it does not allow; always a bug of the caller."""


class RecordTooLarge(DiodeError):  # noqa: N818  name fixed by the API contract
    """A record's key, value and headers exceed ``max_record_size``; the caller skips it.

    Bad data, not a bug: hence not a ``LocalProtocolError``.
    """

    def __init__(self, topic: str, partition: int, offset: int, size: int, limit: int) -> None:
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.size = size
        self.limit = limit
        super().__init__(f"{topic}:{partition}:{offset} has {size} bytes, over {limit}")


class RemoteProtocolError(DiodeError):
    """Input received from the wire is invalid.

    Decoders raise this internally and turn it into a counted drop; it never escapes a decoder's
    public ``receive_datagram``.
    """

    def __init__(self, reason: object, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else str(reason))


class KeyRingError(DiodeError):
    """Key material is missing, unreadable, malformed, or a key id is unknown."""


class BundleError(DiodeError):
    """A resend bundle cannot be trusted or read (tampered, truncated, wrong key or version)."""


class GapStateError(DiodeError):
    """Serialised detector state is unreadable, truncated, of another version or another config."""


class ServiceError(DiodeError):
    """An external service or tool the process depends on is unusable."""

    retriable = True


class KafkaClientError(ServiceError):
    """A Kafka client call failed; ``name`` is librdkafka's error name (e.g. ``_TRANSPORT``)."""

    def __init__(
        self, message: str, *, name: str, retriable: bool, topic: str | None = None
    ) -> None:
        self.name = name
        self.retriable = retriable
        self.topic = topic  # the topic the failed call was about (creating it), if one
        super().__init__(message)


class LocalKafkaError(ServiceError):
    """The embedded Kafka broker could not be fetched, started, reached or stopped."""

    retriable = False


class JvmBuildError(ServiceError):
    """kafka-diode's own JVM classes could not be compiled (no ``javac``, or it failed)."""

    retriable = False
