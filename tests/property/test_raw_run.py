"""Raw layout v2 runs (``common.raw_run``): what the receiver encodes, every Avro reader reads.

Runs hold up to thousands of records, so the decoder's fast paths for columns of 64 items or more
(consecutive offsets and timestamps, numpy-decoded deltas, same-length keys and values, all-empty
headers) are held to fastavro here: for any run, ours decodes exactly what fastavro decodes; a
mangled run decodes as fastavro does or is malformed, never anything else.
"""

from __future__ import annotations

import io
import random

import fastavro
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from common.errors import RemoteProtocolError
from common.raw_run import RunBuilder, check_run, parse_run_key
from common.wire.batch_decode import decode_record_groups
from common.wire.batch_encode import RECORD_BATCH_SCHEMA, encode_headers
from common.wire.events import Headers

#: A record's headers: names of any text, null, empty and short values, a long one now and then.
HEADERS = st.lists(
    st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=12) | st.binary(min_size=70)),
    min_size=1,
    max_size=4,
).map(tuple)


def reference(data: bytes) -> list[tuple]:
    """Every record of ``data`` as fastavro reads it."""
    out = []
    for g in fastavro.schemaless_reader(io.BytesIO(data), RECORD_BATCH_SCHEMA)["groups"]:
        for od, td, k, v, h in zip(g["offset_deltas"], g["timestamp_deltas"], g["keys"],
                                   g["values"], g["headers"], strict=True):  # fmt: skip
            headers = tuple((x["key"], x["value"]) for x in h)
            out.append((g["base_offset"] + od, g["base_timestamp"] + td, k, v, headers))
    return out


def ours(data: bytes) -> list[tuple]:
    groups, _ = decode_record_groups(data)
    return [
        rec
        for g in groups
        for rec in zip(g.offsets, g.timestamps, g.keys, g.values, g.headers, strict=True)
    ]


@st.composite
def runs(draw):
    n = draw(st.sampled_from([1, 5, 63, 64, 65, 200, 1000, 3000]))
    stride = draw(st.sampled_from([1, 1, 2, 7]))
    first = draw(st.integers(0, 2**40))
    base_ts = draw(st.integers(-(2**40), 2**41))
    rnd = random.Random(draw(st.integers(0, 2**32)))
    ts_mode = draw(st.sampled_from(["consecutive", "small", "wide", "equal"]))
    value_mode = draw(st.sampled_from(["same", "varied", "nulls", "empty", "long"]))
    headers_mode = draw(st.sampled_from(["none", "some", "all"]))
    if value_mode == "long":
        # 70 KB values test the long length varints; a count past the 64-record block edge adds
        # nothing but fastavro time (3000 of them is a 210 MB run, past any receiver's cap)
        n = min(n, 65)
    run = RunBuilder(
        "orders.eu", draw(st.integers(0, 2**31 - 1)), rnd.randint(0, 2), first, base_ts
    )
    for i in range(n):
        ts = {
            "consecutive": base_ts + i,
            "small": base_ts + rnd.randint(-63, 63),
            "wide": base_ts + rnd.randint(-(10**9), 10**9),
            "equal": base_ts,
        }[ts_mode]
        length = {"same": 200, "varied": rnd.randint(0, 9000), "nulls": 3, "empty": 0,
                  "long": 70_000}[value_mode]  # fmt: skip
        value = None if value_mode == "nulls" and rnd.random() < 0.5 else b"v" * length
        key = None if rnd.random() < 0.1 else b"k%d" % rnd.randint(0, 10**6)
        headers: tuple = ()
        if headers_mode == "all" or (headers_mode == "some" and rnd.random() < 0.3):
            headers = (("h", None), ("trace", b"%d" % i))
        run.append(first + i * stride, ts, key, value, headers)
    return run


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.data_too_large])  # fmt: skip
@given(runs())
def test_runs_decode_exactly_as_fastavro_reads_them(run: RunBuilder) -> None:
    data = run.encode()
    assert ours(data) == reference(data)
    topic, partition, first, last, stride = parse_run_key(run.key())  # type: ignore[misc]
    group = check_run(data, topic, partition, first, last, stride)
    assert len(group) == run.count
    assert abs(run.size - len(data)) <= 55  # the size the receiver's cap counts


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.data_too_large])  # fmt: skip
@given(runs(), st.integers(0, 2**32))
def test_mangled_runs_decode_as_fastavro_or_are_malformed(run: RunBuilder, seed: int) -> None:
    valid = run.encode()
    rnd = random.Random(seed)
    for _ in range(30):
        data = bytearray(valid)
        for _ in range(rnd.randint(1, 3)):
            data[rnd.randrange(len(data))] = rnd.choice(
                [0, 2, 0x80, 0x81, 0xFF, rnd.randrange(256)]
            )
        data = bytes(data)
        try:
            expected = reference(data)
        except Exception:
            expected = None
        try:
            got = ours(data)
        except RemoteProtocolError:
            continue  # refusing is always allowed (hostile input)
        assert expected is not None
        assert got == expected


def _state(builder: RunBuilder) -> tuple[object, ...]:
    return builder.size, builder.count, builder.last, builder.stride, builder.encode()


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(1 << 64), 1 << 64),
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=20_000),
            st.sampled_from([1, 1, 1, 0, 2]),  # the offset's step from the last
            st.just(()) | HEADERS,
        ),
        min_size=2,
        max_size=40,
    ),
    st.integers(0, 1 << 40),
    st.integers(100, 60_000),
    st.booleans(),
)
def test_append_next_is_append_or_nothing(
    records: list[tuple[int, bytes | None, bytes | None, int, Headers]],
    first: int,
    cap: int,
    strided: bool,
) -> None:
    """``RunBuilder.append_next`` adds what ``append`` adds for a record that continues the
    run by stride 1 with a timestamp delta that fits and room under the cap, and nothing
    (returning False) for any other: a stride that is not 1, a delta out of range, no room."""
    base_ts = records[0][0] % (1 << 40)
    ours = RunBuilder("t", 3, 1, first, base_ts)
    reference = RunBuilder("t", 3, 1, first, base_ts)
    for builder in (ours, reference):
        builder.append(first, base_ts, records[0][1], records[0][2], records[0][4])
        if strided:  # a run of every other offset (a share chain's)
            builder.append(first + 2, base_ts, None, None, ())
    for ts, key, value, step, headers in records[1:]:
        offset = ours.last + step
        before = _state(ours)
        taken = ours.append_next(offset, ts, key, value, headers, cap)
        follows = step == 1 and ours.stride <= 1 and -(1 << 63) <= ts - base_ts < 1 << 63
        if taken:
            reference.append(offset, ts, key, value, headers)
            assert follows
            assert ours.size <= cap
            assert _state(ours) == _state(reference)
        else:
            assert _state(ours) == before
            if follows:  # refused only for want of room
                grown = _grown(offset - first, ts - base_ts, key, value, headers)
                assert ours.size + grown > cap


def _grown(
    delta: int, ts_delta: int, key: bytes | None, value: bytes | None, headers: Headers
) -> int:
    """What ``append`` adds to the size for the record (its own arithmetic)."""
    probe = RunBuilder("t", 3, 1, 0, 0)
    probe.append(0, 0, None, None, ())
    size = probe.size
    probe.append(delta, ts_delta, key, value, headers)
    return probe.size - size


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(1 << 40), 1 << 40),
            st.none() | st.binary(max_size=40),
            st.none() | st.binary(max_size=20_000),
            st.just(()) | HEADERS,
        ),
        min_size=2,
        max_size=40,
    ),
    st.lists(st.integers(1, 5), min_size=1, max_size=40),
    st.integers(0, 1 << 40),
    st.booleans(),
)
def test_extend_in_pieces_is_append_record_by_record(
    records: list[tuple[int, bytes | None, bytes | None, Headers]],
    pieces: list[int],
    first: int,
    encoded: bool,
) -> None:
    """``RunBuilder.extend`` (one record, or several in one piece, with or without headers,
    given as tuples or ``encoded`` as the decoder hands them over) adds the bytes and the size
    ``append`` adds for the same records one by one."""
    base_ts = records[0][0]
    each = RunBuilder("t", 3, 1, first, base_ts)
    whole = RunBuilder("t", 3, 1, first, base_ts)
    for at, (ts, key, value, headers) in enumerate(records):
        each.append(first + at, ts, key, value, headers)
    whole.append(first, base_ts, records[0][1], records[0][2], records[0][3])
    at = 1
    for n in pieces * len(records):
        if at >= len(records):
            break
        part = records[at : at + n]
        offsets = [first + at + i for i in range(len(part))]
        columns = [[r[i] for r in part] for i in range(4)]
        blob = b"".join(encode_headers(h) for h in columns[3]) if encoded else None
        assert whole.extend(offsets, *columns, 1 << 30, blob)
        at += len(part)
    assert whole.size == each.size
    assert whole.count == each.count == len(records)
    assert whole.last == each.last
    assert whole.encode() == each.encode()
