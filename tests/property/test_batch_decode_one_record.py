"""The one-record fast path of the batch decoder agrees with the general reader.

``_one_record`` reads a batch of one record, with or without headers, the shape in which a
record that fills a datagram alone crosses the link; it must return exactly what
``_decode_groups`` returns for the same bytes, and None (the general reader decides) for
anything else: batches of other shapes, and every mutation of a valid one (flipped, cut or added
bytes), however the general reader then judges them.
"""

from __future__ import annotations

import io

import pytest
from fastavro import schemaless_writer
from hypothesis import given, settings
from hypothesis import strategies as st

from common.errors import RemoteProtocolError
from common.wire.batch_decode import _decode_groups, _one_record, decode_record_groups
from common.wire.batch_encode import (
    NULL_ITEM,
    RECORD_BATCH_SCHEMA,
    bytes_item,
    encode_headers,
    single_record_batch,
)
from common.wire.envelope import encode_long

INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
OFFSETS = st.integers(0, (1 << 63) - 1)
ITEMS = st.none() | st.binary(max_size=300) | st.binary(min_size=8000, max_size=20_000)


def general(data: bytes) -> object:
    """What the general reader makes of ``data``: its groups, or the reason it refused them."""
    try:
        return _decode_groups(data)
    except RemoteProtocolError as exc:
        return exc.reason
    except (IndexError, UnicodeDecodeError):
        return "malformed"


@st.composite
def one_record_batches(draw: st.DrawFn) -> bytes:
    """A batch of one record as the encoder writes it (``single_record_batch``) or as any Avro
    writer may (fastavro): short and long topic names, any partition, timestamp type, offset,
    timestamp, null, empty and long keys and values, sometimes headers."""
    topic = draw(st.text(min_size=0, max_size=70))
    partition = draw(st.integers(0, 100) | st.integers(-5, (1 << 31) - 1))
    ts_type = draw(st.integers(-1, 3))
    offset = draw(OFFSETS | st.integers(-5, -1))
    timestamp = draw(INT64)
    key, value = draw(ITEMS), draw(ITEMS)
    headers = draw(
        st.lists(
            st.tuples(
                st.text(max_size=5),
                st.none() | st.binary(max_size=5) | st.binary(min_size=60, max_size=200),
            )
        )
    )
    if draw(st.booleans()) and partition >= 0 and ts_type >= 0 and offset >= 0:
        kprefix = NULL_ITEM[0] if key is None else bytes_item(len(key))[0]
        vprefix = NULL_ITEM[0] if value is None else bytes_item(len(value))[0]
        return single_record_batch(
            topic, partition, ts_type, offset, timestamp, kprefix, key, vprefix, value,
            encode_headers(headers),
        )  # fmt: skip
    out = io.BytesIO()
    group = {
        "topic": topic,
        "partition": partition,
        "timestamp_type": ts_type,
        "base_offset": offset,
        "base_timestamp": timestamp,
        "offset_deltas": [0],
        "timestamp_deltas": [0],
        "keys": [key],
        "values": [value],
        "headers": [[{"key": k, "value": v} for k, v in headers]],
    }
    schemaless_writer(out, RECORD_BATCH_SCHEMA, {"groups": [group]})
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(one_record_batches())
def test_a_one_record_batch_reads_as_the_general_reader_reads_it(data: bytes) -> None:
    fast = _one_record(data)
    expected = general(data)
    if fast is not None:
        assert fast == expected
    # the fast path takes every valid batch of its shape (or it would be a path never taken)
    groups = expected[0] if isinstance(expected, tuple) else ()
    if (
        len(groups) == 1
        and len(groups[0].offsets) == 1
        and len(groups[0].topic.encode()) < 64
        and groups[0].partition < 64
    ):
        assert fast is not None
    # and the entry point gives what the general reader gives, or refuses as it does
    if isinstance(expected, tuple):
        assert decode_record_groups(data) == expected
    else:
        with pytest.raises(RemoteProtocolError) as refused:
            decode_record_groups(data)
        assert refused.value.reason == expected or expected == "malformed"


@settings(max_examples=800, deadline=None)
@given(one_record_batches(), st.data())
def test_any_mutation_is_read_as_the_general_reader_reads_it(
    data: bytes, draw: st.DataObject
) -> None:
    # the valid batch first: the reader's memos then hold its head and timestamp, and the mutated
    # bytes, which share most of them, must not be read through a memo that no longer applies
    _one_record(data)
    mutated = bytearray(data)
    for _ in range(draw.draw(st.integers(1, 3))):
        how = draw.draw(st.sampled_from(["flip", "cut", "add", "length"]))
        if how == "flip" and mutated:
            at = draw.draw(st.integers(0, len(mutated) - 1))
            mutated[at] ^= draw.draw(st.integers(1, 255))
        elif how == "cut" and mutated:
            del mutated[draw.draw(st.integers(0, len(mutated) - 1)) :]
        elif how == "add":
            mutated += draw.draw(st.binary(min_size=1, max_size=4))
        elif how == "length" and len(mutated) > 3:
            at = draw.draw(st.integers(1, len(mutated) - 2))
            mutated[at : at + 1] = encode_long(draw.draw(st.integers(-3, 1 << 20)))
    data = bytes(mutated)
    if not data:
        return
    fast = _one_record(data) if data[:1] == b"\x02" else None
    if fast is not None:
        assert fast == general(data)
