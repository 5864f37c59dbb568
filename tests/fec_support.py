"""In-memory FEC endpoints: wire Encoder + FecEncoder on one side, the receiver's glue on the other.

``FecLink.receive`` mirrors ``receiver.app.Receiver._on_datagram``: repairs go to the
``FecDecoder``; other datagrams to the normal ``Decoder``, and those it authenticated join the
FEC source buffer; whatever the FEC decoder rebuilds goes back through the normal decoder.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from common.wire import Decoder, Encoder, Record, RecordBatch, WireConfig
from common.wire.fec import FecConfig, FecDecoder, FecEncoder, FecLimits, is_repair
from tests.wire_support import SESSION, add, ring

MAX_DATAGRAM = 1452


def sender(
    config: FecConfig, *, max_datagram_size: int = MAX_DATAGRAM, session: bytes = SESSION
) -> tuple[Encoder, FecEncoder]:
    source_size = max_datagram_size - config.overhead_bytes
    wire = WireConfig(max_datagram_size=source_size)
    keys = ring()
    return (
        Encoder(wire, keys, session_id=session),
        FecEncoder(config, keys, session_id=session, max_source_size=source_size),
    )


def encode_with_repairs(
    config: FecConfig, records: Iterable[Record], *, stream: int = 0, now: float = 0.0
) -> tuple[list[bytes], list[bytes]]:
    """(sources, every datagram in send order: each block's repairs right after its sources)."""
    encoder, fec = sender(config)
    sources: list[bytes] = []
    wire: list[bytes] = []

    def put(datagrams: list) -> None:
        for d in datagrams:
            sources.append(d.data)
            wire.append(d.data)
            wire.extend(fec.add(d.data, stream, now))

    for rec in records:
        put(add(encoder, rec, now))
    put(encoder.flush())
    wire.extend(r for _, r in fec.flush())
    return sources, wire


class FecLink:
    """The receiving side (see the module docstring)."""

    def __init__(self, limits: FecLimits | None = None) -> None:
        keys = ring()
        self.decoder = Decoder(WireConfig(), keys)
        self.fec = FecDecoder(limits or FecLimits(), keys)
        self.offsets: list[tuple[str, int, int]] = []
        self.drops: dict[str, int] = {}

    def receive(self, data: bytes, now: float = 0.0) -> None:
        if is_repair(data):
            self._decode(self.fec.receive_repair(data, now), now)
        else:
            before = self.decoder.authenticated
            self.decoder.receive_datagram(data, now)
            self._events()
            if self.decoder.authenticated != before:
                self._decode(self.fec.add_source(data, now), now)
        for reason, _ in self.fec.pop_drops():
            self.drops[str(reason)] = self.drops.get(str(reason), 0) + 1

    def timer(self, now: float) -> None:
        self.fec.handle_timer(now)
        self.decoder.handle_timer(now)
        self._events()

    def _decode(self, rebuilt: list[bytes], now: float) -> None:
        for datagram in rebuilt:
            self.decoder.receive_datagram(datagram, now)
            self._events()

    def _events(self) -> None:
        while (event := self.decoder.next_event()) is not None:
            if isinstance(event, RecordBatch):
                self.offsets.extend((r.topic, r.partition, r.offset) for r in event.records)
            else:
                reason = str(getattr(event, "reason", type(event).__name__))
                self.drops[reason] = self.drops.get(reason, 0) + 1


def records(n: int, *, size: int = 200, topic: str = "t") -> list[Record]:
    return [
        Record(topic, i % 3, i, 1_700_000_000_000 + i, 1, b"k%d" % i, bytes([i % 251]) * size, ())
        for i in range(n)
    ]


def fec_config(**changes: object) -> FecConfig:
    # explicit interleave: these tests count blocks of consecutive sources (the default is 4)
    base = FecConfig(overhead=20, block_size=16, interleave=1)
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]
