"""Helpers shared by the wire protocol tests: in-memory endpoints and crafted datagrams."""

from __future__ import annotations

import os

from common.wire import Decoder, Dropped, Encoder, Key, KeyRing, Record, RecordBatch, WireConfig
from common.wire.crypto import SessionCipher
from common.wire.envelope import CIPHER_AES_256_GCM, CIPHER_NONE, build_header, frame

KEY = Key.from_material(bytes(range(32)))
SESSION = bytes(range(100, 116))


def ring(*keys: Key) -> KeyRing:
    return KeyRing(keys or (KEY,))


def endpoints(config: WireConfig | None = None, *, session: bytes = SESSION):
    config = config or WireConfig()
    keys = ring()
    return Encoder(config, keys, session_id=session), Decoder(config, keys)


def add(encoder: Encoder, rec: Record, now: float = 0.0):
    return encoder.add(
        rec.topic,
        rec.partition,
        rec.offset,
        rec.timestamp,
        rec.timestamp_type,
        rec.key,
        rec.value,
        rec.headers,
        now,
    )


def encode_all(encoder: Encoder, records) -> list:
    out = []
    for rec in records:
        out += add(encoder, rec)
    return out + encoder.flush()


def drain(decoder: Decoder) -> list:
    events = []
    while (event := decoder.next_event()) is not None:
        events.append(event)
    return events


def feed(decoder: Decoder, datagrams, now: float = 0.0) -> list:
    events = []
    for d in datagrams:
        decoder.receive_datagram(d.data if hasattr(d, "data") else d, now)
        events += drain(decoder)
    return events


def records_of(events) -> list[Record]:
    return [r for e in events if isinstance(e, RecordBatch) for r in e.records]


def drops_of(events) -> list[Dropped]:
    return [e for e in events if isinstance(e, Dropped)]


def craft(
    chunk: bytes,
    *,
    kind: int = 0,
    compression: int = 0,
    sequence: int = 0,
    index: int = 0,
    count: int = 1,
    total: int | None = None,
    key: Key | None = KEY,
    session: bytes = SESSION,
) -> bytes:
    """An authentic datagram with arbitrary (possibly lying) header fields."""
    header = build_header(
        kind=kind,
        compression=compression,
        cipher=CIPHER_NONE if key is None else CIPHER_AES_256_GCM,
        session_id=session,
        sequence=sequence,
        key_id=0 if key is None else key.key_id,
        fragment_index=index,
        fragment_count=count,
        message_length=len(chunk) if total is None else total,
    )
    body = chunk if key is None else SessionCipher(key, session).seal(sequence, chunk, header)
    return frame(header, body)


def random_session() -> bytes:
    return os.urandom(16)
