"""The direct layout's state record (``dedup/direct_state.py``): its key, its value's round trip
and the values it refuses, without Kafka."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from common.errors import GapStateError
from dedup.detector_set import DetectorSet
from dedup.direct_state import MAGIC, MAX_HEADER_BYTES, PART_MAGIC, StateRecord, state_key

ENTRIES = {("t", 0): (b"blob", 5), ("u", 3): (b"", 7)}


def _record(**fields) -> StateRecord:
    values = {
        "batch_id": 42,
        "raw_topic": "raw",
        "raw_partition": 2,
        "detectors": DetectorSet(ENTRIES),
        "records": 1_000,
        "gaps": 3,
        "committed_at_ms": 1_700_000_000_000,
        **fields,
    }
    return StateRecord(**values)


def _value(
    header: bytes, container: bytes | None = None, length: int | None = None, magic: bytes = MAGIC
) -> bytes:
    """A state record's value by hand: magic, announced length, header, container."""
    body = DetectorSet(ENTRIES).to_bytes() if container is None else container
    announced = len(header) if length is None else length
    return magic + struct.pack(">I", announced) + header + body


def _assert_same(back: StateRecord, record: StateRecord) -> None:
    assert back.batch_id == record.batch_id
    assert back.raw_topic == record.raw_topic
    assert back.raw_partition == record.raw_partition
    assert back.records == record.records
    assert back.gaps == record.gaps
    assert back.committed_at_ms == record.committed_at_ms
    assert back.through_offset == record.through_offset
    assert back.detectors.to_bytes() == record.detectors.to_bytes()


def test_a_record_round_trips_with_its_detectors() -> None:
    record = _record()
    value = record.encode()
    assert value.startswith(MAGIC)
    back = StateRecord.decode(value)
    _assert_same(back, record)
    assert list(back.detectors) == [("t", 0), ("u", 3)]
    assert back.detectors.get(("t", 0)) == (b"blob", 5)
    assert back.detectors.get(("u", 3)) == (b"", 7)
    assert back.encode() == value


def test_a_record_before_the_first_batch_round_trips_with_no_detectors() -> None:
    record = _record(batch_id=-1, detectors=DetectorSet(), records=0, gaps=0, committed_at_ms=0)
    back = StateRecord.decode(record.encode())
    _assert_same(back, record)
    assert len(back.detectors) == 0


def test_the_header_is_json_with_every_field() -> None:
    value = _record().encode()
    (length,) = struct.unpack_from(">I", value, len(MAGIC))
    start = len(MAGIC) + 4
    assert json.loads(value[start : start + length]) == {
        "batch_id": 42,
        "raw_topic": "raw",
        "raw_partition": 2,
        "records": 1_000,
        "gaps": 3,
        "committed_at_ms": 1_700_000_000_000,
    }
    assert value[start + length :] == DetectorSet(ENTRIES).to_bytes()


def test_the_counters_default_to_zero_when_the_header_omits_them() -> None:
    header = b'{"batch_id":7,"raw_topic":"raw","raw_partition":1}'
    back = StateRecord.decode(_value(header))
    assert (back.batch_id, back.raw_topic, back.raw_partition) == (7, "raw", 1)
    assert (back.records, back.gaps, back.committed_at_ms) == (0, 0, 0)
    assert back.detectors.to_bytes() == DetectorSet(ENTRIES).to_bytes()


def test_a_part_round_trips_under_its_own_magic() -> None:
    """A part of a batch (docs/dedup-internals.md "Parts of a batch") starts with another magic
    than a whole batch: a version that knows no parts refuses it (it would take the batch as
    complete and skip its rest) instead of losing records."""
    part = _record(through_offset=41)
    value = part.encode()
    assert value.startswith(PART_MAGIC)
    assert not part.complete
    back = StateRecord.decode(value)
    _assert_same(back, part)
    assert not back.complete
    assert back.encode() == value
    assert _record().complete
    assert _record().encode().startswith(MAGIC)


def test_the_key_is_query_topic_and_partition() -> None:
    key = state_key("3f2a-query", "raw.link", 11)
    assert isinstance(key, bytes)
    assert key == b"3f2a-query:raw.link:11"
    assert state_key("q", "raw", 0) != state_key("q", "raw", 1)
    assert state_key("q", "raw", 0) != state_key("other", "raw", 0)


GOOD_HEADER = b'{"batch_id":1,"raw_topic":"raw","raw_partition":0}'


@pytest.mark.parametrize(
    "value",
    [
        pytest.param(b"KDDS9" + _record().encode()[5:], id="wrong-magic"),
        pytest.param(PART_MAGIC + _record().encode()[5:], id="part-magic-without-an-offset"),
        pytest.param(
            _value(b'{"batch_id":1,"raw_topic":"r","raw_partition":0,"through_offset":5}'),
            id="an-offset-under-the-whole-batch-magic",
        ),
        pytest.param(
            _value(
                b'{"batch_id":1,"raw_topic":"r","raw_partition":0,"through_offset":"5"}',
                magic=PART_MAGIC,
            ),
            id="a-mistyped-offset",
        ),
        pytest.param(b"KDBK\x01" + _record().encode()[5:], id="a-bucket-container"),
        pytest.param(b"", id="empty"),
        pytest.param(MAGIC + b"\0\0", id="magic-and-half-a-length"),
        pytest.param(_value(GOOD_HEADER, b"", length=len(GOOD_HEADER) + 1), id="header-truncated"),
        pytest.param(
            _value(GOOD_HEADER, length=len(_value(GOOD_HEADER))), id="length-beyond-the-value"
        ),
        pytest.param(
            _value(b" " * (MAX_HEADER_BYTES + 1 - len(GOOD_HEADER)) + GOOD_HEADER),
            id="valid-json-above-the-bound",
        ),
        pytest.param(_value(GOOD_HEADER, length=1 << 31), id="length-far-above-the-bound"),
        pytest.param(_value(b"not json"), id="header-not-json"),
        pytest.param(_value(b"\xff\xfe{}"), id="header-not-utf8"),
        pytest.param(_value(b'{"raw_topic":"raw","raw_partition":0}'), id="no-batch-id"),
        pytest.param(_value(b'{"batch_id":1,"raw_partition":0}'), id="no-raw-topic"),
        pytest.param(_value(b'{"batch_id":"x","raw_topic":"r","raw_partition":0}'), id="bad-id"),
        pytest.param(_value(b"[1, 2]"), id="header-a-list"),
        pytest.param(_value(b"null"), id="header-null"),
        pytest.param(_value(GOOD_HEADER, DetectorSet(ENTRIES).to_bytes()[:-1]), id="truncated"),
        pytest.param(_value(GOOD_HEADER, DetectorSet(ENTRIES).to_bytes()[:7]), id="short-count"),
        pytest.param(_value(GOOD_HEADER, b""), id="no-container"),
        pytest.param(_value(GOOD_HEADER, DetectorSet(ENTRIES).to_bytes() + b"\0"), id="trailing"),
    ],
)
def test_a_value_that_is_not_a_state_record_is_refused(value: bytes) -> None:
    with pytest.raises(GapStateError):
        StateRecord.decode(value)


def test_a_header_at_the_bound_is_read_and_one_above_it_is_refused() -> None:
    padded = GOOD_HEADER[:-1] + b',"pad":"' + b"x" * MAX_HEADER_BYTES + b'"}'
    at_bound = padded[: MAX_HEADER_BYTES - 2] + b'"}'
    assert len(at_bound) == MAX_HEADER_BYTES
    assert StateRecord.decode(_value(at_bound)).batch_id == 1
    above = padded[: MAX_HEADER_BYTES - 1] + b'"}'
    with pytest.raises(GapStateError, match="header"):
        StateRecord.decode(_value(above))


def test_a_truncated_header_names_the_announced_length() -> None:
    with pytest.raises(GapStateError, match="truncated") as info:
        StateRecord.decode(_value(GOOD_HEADER, b"", length=len(GOOD_HEADER) + 1))
    assert str(len(GOOD_HEADER) + 1) in str(info.value)


@given(
    batch_id=st.integers(min_value=-1, max_value=2**62),
    raw_topic=st.from_regex(r"[A-Za-z0-9._-]{1,40}", fullmatch=True),
    raw_partition=st.integers(0, 2**31 - 1),
    entries=st.dictionaries(
        st.tuples(st.text(min_size=1, max_size=20), st.integers(-1, 2**31 - 1)),
        st.tuples(st.binary(max_size=64), st.integers(-(2**63), 2**63 - 1)),
        max_size=8,
    ),
    counters=st.tuples(st.integers(0, 2**53), st.integers(0, 2**53), st.integers(0, 2**53)),
    through_offset=st.integers(-1, 2**62),
)
def test_any_batch_and_detectors_round_trip(
    batch_id: int,
    raw_topic: str,
    raw_partition: int,
    entries: dict[tuple[str, int], tuple[bytes, int]],
    counters: tuple[int, int, int],
    through_offset: int,
) -> None:
    records, gaps, committed_at_ms = counters
    record = StateRecord(
        batch_id=batch_id,
        raw_topic=raw_topic,
        raw_partition=raw_partition,
        detectors=DetectorSet(entries),
        records=records,
        gaps=gaps,
        committed_at_ms=committed_at_ms,
        through_offset=through_offset,
    )
    value = record.encode()
    back = StateRecord.decode(value)
    _assert_same(back, record)
    assert {key: back.detectors.get(key) for key in back.detectors} == entries
    assert back.encode() == value
