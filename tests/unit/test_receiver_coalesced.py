"""The receiver's glue for a coalesced read (``Receiver._on_coalesced``): what reaches the sink.

A GRO read of a large record's datagrams must give the sink the same records, and the receiver's
counters the same values, as those datagrams read one by one; while an FEC block waits for a
source the read goes one by one (a source may then rebuild others, decoded right after it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from common.wire import Encoder, WireConfig
from common.wire.keyring import Key, KeyRing
from runtime import key_files
from tests.receiver_support import glue_receiver


def _datagrams(ring: KeyRing, values: list[bytes]) -> list[bytes]:
    encoder = Encoder(WireConfig(), ring, session_id=b"s" * 16)
    out = []
    for offset, value in enumerate(values):
        out += [d.data for d in encoder.add("t", 0, offset, 1, 0, b"k", value, (), 0.0)]
        out += [d.data for d in encoder.flush()]
    return out


def _reads(datagrams: list[bytes]) -> list[tuple[bytes, int]]:
    """GRO reads as the kernel makes them of the sender's runs: equal sizes, the last shorter."""
    reads, run = [], [datagrams[0]]
    for data in datagrams[1:]:
        if len(data) > len(run[0]) or len(run[-1]) < len(run[0]):
            reads.append((b"".join(run), len(run[0])))
            run = []
        run.append(data)
    reads.append((b"".join(run), len(run[0])))
    return reads


def _both(tmp_path: Path, awaiting: bool) -> tuple[Any, ...]:
    key_file = tmp_path / "keys.json"
    ring = KeyRing([Key.generate()])
    key_files.write_keyring(ring, key_file)
    values = [b"first"] + [os.urandom(n) for n in (10_000, 300, 9_000, 20_000)]
    datagrams = _datagrams(ring, values)
    one, one_sink = glue_receiver(key_file)
    whole, whole_sink = glue_receiver(key_file)
    if awaiting:  # a block waits for a source that is not among these: nothing to rebuild
        whole.fec._waiting[b"elsewhere"] = (b"s" * 16, 0)
    try:
        for data in datagrams:
            one._on_datagram(data)
        whole._on_datagram(datagrams[0])  # the session becomes known, as on a live link
        for data, segment in _reads(datagrams[1:]):
            if len(data) > segment:
                whole._on_coalesced(data, segment)
            else:
                whole._on_datagram(data)
    finally:
        for r in (one, whole):
            assert r._loop is not None
            r._loop.close()
    expected = [("t", 0, offset, value) for offset, value in enumerate(values)]
    assert one_sink.records == expected
    return one, whole, whole_sink, expected


def test_a_coalesced_read_reaches_the_sink_as_its_datagrams_one_by_one(tmp_path: Path) -> None:
    one, whole, sink, expected = _both(tmp_path, awaiting=False)
    assert sink.records == expected
    assert whole.stats.snapshot() == one.stats.snapshot()
    assert whole._decoder.coalesced_messages == 3  # the 9 KB, 10 KB and 20 KB records
    for receiver in (one, whole):
        receiver.fec._index()  # what a block that looks finds
    assert len(whole.fec._sources) == len(one.fec._sources) > 0  # every source kept either way


def test_while_an_fec_block_waits_a_coalesced_read_goes_one_by_one(tmp_path: Path) -> None:
    one, whole, sink, expected = _both(tmp_path, awaiting=True)
    assert sink.records == expected
    assert whole.stats.snapshot() == one.stats.snapshot()
    assert whole._decoder.coalesced_messages == 0


def _read_of_singles(ring: KeyRing, change: str) -> tuple[bytes, list[bytes], int]:
    """A GRO read of twelve one-record datagrams of one size (a 1 KB record fills one), and the
    first datagram of the session (sent before it); ``change`` alters the seventh."""
    datagrams = _datagrams(ring, [bytes([n]) * 1000 for n in range(13)])
    assert len({len(d) for d in datagrams}) == 1
    first, rest = datagrams[0], datagrams[1:]
    seventh = bytearray(rest[6])
    if change == "tampered":  # fails its GCM tag
        seventh[-1] ^= 1
    elif change == "repair":  # the kind byte of a repair (docs/protocol.md §3), not a valid one
        seventh[5] = 4
    elif change == "foreign":  # not ours at all
        seventh[:] = os.urandom(len(seventh))
    rest[6] = bytes(seventh)
    return b"".join(rest), [first, *rest], len(first)


@pytest.mark.parametrize("change", ["none", "tampered", "repair", "foreign"])
def test_a_read_of_whole_datagrams_reaches_the_sink_as_one_by_one(
    tmp_path: Path, change: str
) -> None:
    """Datagrams that each hold whole records, decoded in one loop per read (``_on_singles``):
    the same records, counters and FEC sources as one by one, whatever one datagram holds."""
    key_file = tmp_path / "keys.json"
    ring = KeyRing([Key.generate()])
    key_files.write_keyring(ring, key_file)
    read, datagrams, segment = _read_of_singles(ring, change)
    one, one_sink = glue_receiver(key_file)
    whole, whole_sink = glue_receiver(key_file)
    try:
        for data in datagrams:
            one._on_datagram(data)
        whole._on_datagram(datagrams[0])
        whole._on_coalesced(read, segment)
    finally:
        for r in (one, whole):
            assert r._loop is not None
            r._loop.close()
    lost = {"none": set(), "tampered": {7}, "repair": {7}, "foreign": {7}}[change]
    assert [r[2] for r in whole_sink.records] == [n for n in range(13) if n not in lost]
    assert whole_sink.records == one_sink.records
    assert whole.stats.snapshot() == one.stats.snapshot()
    # the loop kept the authentic datagrams before the seventh as one read (not one by one)
    assert max((stop - start) // step for _, _, start, stop, step in whole.fec._reads) >= 6
    for receiver in (one, whole):
        receiver.fec._index()
    assert whole.fec._sources.keys() == one.fec._sources.keys()
    assert len(whole.fec._sources) == 13 - len(lost)


def test_a_bug_on_one_datagram_of_a_read_loses_no_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception while one datagram of a read is decoded (a bug) is counted as an internal
    error; that datagram is no FEC source, and every other one reaches the sink."""
    key_file = tmp_path / "keys.json"
    ring = KeyRing([Key.generate()])
    key_files.write_keyring(ring, key_file)
    read, datagrams, segment = _read_of_singles(ring, "none")
    receiver, sink = glue_receiver(key_file)
    decoder = receiver._decoder
    real = decoder.receive_datagram

    def buggy(data: bytes, now: float) -> None:
        if data == datagrams[7]:
            raise RuntimeError("a bug")
        real(data, now)

    try:
        receiver._on_datagram(datagrams[0])
        monkeypatch.setattr(decoder, "receive_datagram", buggy)
        receiver._on_coalesced(read, segment)
    finally:
        assert receiver._loop is not None
        receiver._loop.close()
    assert [r[2] for r in sink.records] == [n for n in range(13) if n != 7]
    assert receiver.stats.snapshot()["drops"] == {"internal_error": 1}
    assert receiver.stats.datagrams == 13
    receiver.fec._index()
    assert len(receiver.fec._sources) == 12
