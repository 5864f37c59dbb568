"""A GRO read's whole datagrams, decoded in one loop (``Receiver._on_singles``, and
bench/transport.py, which measures the receive path without Kafka).

Why: a record of 1 KB and up fills a datagram alone, and per datagram the receiver's glue (the
clock, counters, an FEC source, an event drain) cost about a tenth of its CPU; with this loop the
caller pays it once per read.
"""

from __future__ import annotations

from collections.abc import Callable

from common.wire.decoder import Decoder
from common.wire.fec import REPAIR_KIND_BYTE, FecDecoder


def decode_singles(  # noqa: PLR0917  the hot loop's inputs, positional
    decoder: Decoder,
    fec: FecDecoder,
    data: bytes,
    start: int,
    segment: int,
    now: float,
    on_error: Callable[[], None],
) -> int:
    """Decode the datagrams of ``segment`` bytes (the last may be shorter) in ``data`` from
    ``start`` on, each as ``decoder.receive_datagram`` takes it alone, up to the first that may
    be a repair; return where it stopped (the caller takes the rest one by one).

    The authentic ones join ``fec`` a range at a time, in order, before any repair after them.
    Call it only while no FEC block waits for a source (``fec.awaiting_sources``): then no
    source can rebuild another, so none has to be decoded between two datagrams of the read.
    ``on_error``: a datagram's decode raised (a bug); it is no source, and the loop goes on.
    """
    stop = len(data)
    at = kept = start  # data[kept:at]: authentic sources not yet handed to the FEC decoder
    while at < stop and data[at + 5 : at + 6] != REPAIR_KIND_BYTE:
        end = min(at + segment, stop)
        authenticated = decoder.authenticated
        try:
            decoder.receive_datagram(data[at:end], now)
            source = decoder.authenticated != authenticated
        except Exception:  # noqa: BLE001  hostile input must never stop the receiver
            on_error()
            source = False
        if not source:
            if kept < at:
                fec.add_sources(data, kept, at, segment, now)
            kept = end
        at = end
    if kept < at:
        fec.add_sources(data, kept, at, segment, now)
    return at
