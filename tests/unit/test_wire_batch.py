"""The hand-written record-batch codec is byte-identical to fastavro for the schema and keeps an
exact size account (what the encoder relies on to fill datagrams)."""

from __future__ import annotations

import io
import random

import pytest
from fastavro import schemaless_reader, schemaless_writer

from common.wire import Record
from common.wire.batch_decode import decode_record_batch, decode_record_groups
from common.wire.batch_encode import RECORD_BATCH_SCHEMA, BatchBuilder, encode_headers


@pytest.mark.parametrize("seed", range(20))
def test_size_is_exact_and_bytes_match_fastavro(seed: int) -> None:
    rnd = random.Random(seed)
    builder = BatchBuilder()
    added = []
    for _ in range(rnd.choice([1, 5, 70, 200])):
        r = Record(
            rnd.choice(["a", "b.c", "d_e-f"]),
            rnd.randint(0, 3),
            rnd.choice([rnd.randint(0, 100), rnd.randint(0, 2**63 - 1)]),
            rnd.randint(-(2**40), 2**45),
            rnd.randint(0, 2),
            rnd.choice([None, b"", rnd.randbytes(rnd.randint(0, 300))]),
            rnd.choice([None, b"", rnd.randbytes(rnd.randint(0, 20000))]),
            tuple(
                (rnd.choice(["x", "ü"]), rnd.choice([None, b"", b"vv"]))
                for _ in range(rnd.randint(0, 3))
            ),
        )
        assert builder.try_add(
            r.topic,
            r.partition,
            r.timestamp_type,
            r.offset,
            r.timestamp,
            r.key,
            r.value,
            encode_headers(r.headers),
            1 << 30,
        )
        added.append(r)
        assert builder.size == len(builder.encode())
    data = builder.encode()
    datum = schemaless_reader(io.BytesIO(data), RECORD_BATCH_SCHEMA, None)
    out = io.BytesIO()
    schemaless_writer(out, RECORD_BATCH_SCHEMA, datum)
    assert out.getvalue() == data
    got = decode_record_batch(data)
    assert sorted(got, key=repr) == sorted(added, key=repr)


def test_decoder_accepts_multi_block_and_negative_count_arrays() -> None:
    # groups array as one block of -1 item (with byte size), then end
    builder = BatchBuilder()
    builder.try_add("t", 0, 1, 5, 7, b"k", b"v", b"\x00", 0)
    body = builder.encode()[1:-1]  # strip the groups count and end marker
    data = b"\x01" + bytes([len(body) * 2]) + body + b"\x00"
    assert decode_record_batch(data) == (Record("t", 0, 5, 7, 1, b"k", b"v", ()),)


def test_try_add_respects_the_limit_but_always_takes_the_first_record() -> None:
    builder = BatchBuilder()
    assert builder.try_add("t", 0, 1, 0, 0, None, b"x" * 100, b"\x00", 10)
    assert not builder.try_add("t", 0, 1, 1, 0, None, b"x", b"\x00", 10)
    assert builder.records == 1


@pytest.mark.parametrize("step", [1, 3, 100, -1])  # a run, one-byte deltas, wider, negative
def test_columnar_groups_agree_with_records_on_every_delta_path(step: int) -> None:
    builder = BatchBuilder()
    for i in range(40):
        offset = 1000 + i * step
        builder.try_add("t", i % 2, 1, offset, 7 + i * step, b"k", None, b"\x00", 1 << 20)
    data = builder.encode()
    groups, count = decode_record_groups(data)
    assert count == 40
    assert [len(g) for g in groups] == [20, 20]
    flat = [
        Record(g.topic, g.partition, o, ts, g.timestamp_type, k, v, h)
        for g in groups
        for o, ts, k, v, h in zip(g.offsets, g.timestamps, g.keys, g.values, g.headers, strict=True)
    ]
    assert flat == list(decode_record_batch(data))
    assert groups[0].offsets == tuple(range(1000, 1000 + 40 * step, 2 * step))
