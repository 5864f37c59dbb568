"""How a direct task's range reader asks librdkafka for records (``dedup/range_reader.py``),
against a fake consumer: ``consume(n, timeout)`` waits until it has ``n`` records or the
timeout, so a call never asks for more than the range still holds (asking for more at a range's
end waited out the timeout in every task). The real broker's side:
tests/integration/test_dedup_range_reader.py."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from common.errors import ServiceError
from dedup import range_reader
from dedup.range_reader import CONSUME_RECORDS, RangeReading, read_range


class FakeMessage:
    def __init__(self, offset: int) -> None:
        self._offset = offset

    def error(self) -> None:
        return None

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v" * 10

    def headers(self) -> None:
        return None


class FakeConsumer:
    """A partition whose log holds offsets ``[0, log_end)``."""

    def __init__(self, log_end: int) -> None:
        self.log_end, self.next, self.asked = log_end, 0, []

    def assign(self, partitions: list[Any]) -> None:
        self.next = partitions[0].offset

    def unassign(self) -> None:
        pass

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        self.asked.append(num)
        if self.next + num > self.log_end:  # librdkafka would wait out the timeout here
            raise AssertionError(f"asked for {num} at {self.next}, the log ends at {self.log_end}")
        out = [FakeMessage(o) for o in range(self.next, self.next + num)]
        self.next += num
        return out

    def position(self, partitions: list[Any]) -> list[Any]:
        partitions[0].offset = self.next
        return partitions


@pytest.mark.parametrize(("start", "end"), [(0, 1), (5, 16), (0, CONSUME_RECORDS * 3 + 7)])
def test_a_range_at_the_log_end_never_asks_for_records_past_it(
    monkeypatch: pytest.MonkeyPatch, start: int, end: int
) -> None:
    fake = FakeConsumer(log_end=end)
    monkeypatch.setattr(range_reader, "_consumer", lambda conf: fake)
    batches = list(read_range(RangeReading(), "raw", 0, start, end, max_batch_bytes=1000))
    assert [o for b in batches for o in b.offsets] == list(range(start, end))
    assert max(fake.asked) <= CONSUME_RECORDS
    assert sum(fake.asked) == end - start


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def str(self) -> str:
        return KafkaError(self._code).str()

    def fatal(self) -> bool:
        return False

    def retriable(self) -> bool:
        return False


class ErrorMessage(FakeMessage):
    def __init__(self, code: int) -> None:
        super().__init__(-1)
        self._error = FakeError(code)

    def error(self) -> FakeError:  # type: ignore[override]
        return self._error


class FailingOverConsumer(FakeConsumer):
    """Its first fetch finds the offset out of range (a leader being replaced), and its
    watermark query fails as librdkafka fails one whose broker handle goes with that leader;
    the next fetch is served."""

    def __init__(self, log_end: int, failure: int) -> None:
        super().__init__(log_end)
        self.failure, self.errors_left, self.watermark_calls, self.assigned = failure, 1, 0, []

    def assign(self, partitions: list[Any]) -> None:
        super().assign(partitions)
        self.assigned.append(partitions[0].offset)

    def consume(self, num: int, timeout: float) -> list[FakeMessage]:
        if self.errors_left:
            self.errors_left -= 1
            return [ErrorMessage(KafkaError.OFFSET_OUT_OF_RANGE)]
        return super().consume(num, timeout)

    def get_watermark_offsets(
        self, partition: Any, timeout: float, cached: bool
    ) -> tuple[int, int]:
        self.watermark_calls += 1
        if self.watermark_calls == 1:
            raise KafkaException(KafkaError(self.failure))
        self.errors_left = 0
        return 0, self.log_end


def test_a_range_reads_on_when_its_leader_is_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CI's coordinator SIGKILL: the range's first fetch found its offset out of range and
    # the log-start query failed with _DESTROY_BROKER; that failed the task and the query.
    fake = FailingOverConsumer(log_end=40, failure=KafkaError._DESTROY_BROKER)
    monkeypatch.setattr(range_reader, "_consumer", lambda conf: fake)
    monkeypatch.setattr(range_reader, "RETRY_PAUSE_S", 0.0)
    batches = list(read_range(RangeReading(), "raw", 0, 10, 40, max_batch_bytes=1000))
    assert [o for b in batches for o in b.offsets] == list(range(10, 40))
    assert fake.watermark_calls == 1
    assert fake.assigned == [10, 10]  # fetched again from the same offset, the new leader's


def test_a_range_fails_when_the_log_start_cannot_be_read_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake = FailingOverConsumer(log_end=40, failure=KafkaError._INVALID_ARG)
    monkeypatch.setattr(range_reader, "_consumer", lambda conf: fake)
    with pytest.raises(ServiceError, match="log start of raw partition raw:0"):
        list(read_range(RangeReading(), "raw", 0, 10, 40))
