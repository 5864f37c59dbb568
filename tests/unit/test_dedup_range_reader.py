"""How a direct task's range reader asks librdkafka for records (``dedup/range_reader.py``),
against a fake consumer: ``consume(n, timeout)`` waits until it has ``n`` records or the
timeout, so a call never asks for more than the range still holds (asking for more at a range's
end waited out the timeout in every task). The real broker's side:
tests/integration/test_dedup_range_reader.py."""

from __future__ import annotations

from typing import Any

import pytest

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
    assert [o for b in batches for o in b.column("offset").to_pylist()] == list(range(start, end))
    assert max(fake.asked) <= CONSUME_RECORDS
    assert sum(fake.asked) == end - start
